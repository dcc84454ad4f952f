//! Docker end to end in the microvm tier: `docker run --runtime=agentvm`
//! (agentvm's default tier) boots each container in its own microVM, and
//! what a Docker user does keeps working — with `exec` landing inside the
//! guest and the guest's kernel, not the host's, answering.
//!
//! The test daemon is the one `tests/docker.rs` uses (see common/docker.rs);
//! the `agentvm` runtime gets a config naming the kernel kernels/build.sh
//! built. Without root, Docker, QEMU, virtiofsd or that kernel each test
//! prints `skipped: <why>`.
//!
//!     cargo test --release --test docker_microvm -- --nocapture

use agentvm_test_support as common;
use common::require;

use std::time::Duration;

use common::docker::{docker_with, Docker};
use common::{rootfs, wait_for, Runtime};

fn microvm_docker() -> Result<Docker, String> {
    if let Some(why) = common::guest::unavailable() {
        return Err(why);
    }
    docker_with(Runtime::AgentvmDefault)
}

#[test]
fn run_echo_in_its_own_kernel() {
    let d = require!(microvm_docker());
    let out = d.run_rm(&[], &["echo", "hello from the microvm"]).ok();
    assert_eq!(out.stdout, "hello from the microvm\n");
    let out = d
        .run_rm(
            &[],
            &["sh", "-c", "uname -r; cat /proc/sys/kernel/random/boot_id"],
        )
        .ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_ne!(
        lines[0],
        common::host_uname_r(),
        "the host's kernel answered"
    );
    assert_ne!(lines[1], common::host_boot_id(), "the host's boot id");
}

#[test]
fn exit_code_is_propagated() {
    let d = require!(microvm_docker());
    d.run_rm(&[], &["sh", "-c", "exit 42"]).code(42);
    d.run_rm(&[], &["/no/such/command"]).code(127);
    d.run_rm(&[], &["/etc/passwd"]).code(126);
}

/// `--pids-limit` holds the container's processes in the guest; the VM's
/// host processes (QEMU's and virtiofsd's threads, Docker's prestart hook,
/// a Go program with threads of its own) are not the container's and
/// never counted against it (a limit of 5 on the host failed the hook).
#[test]
fn pids_limit_caps_the_guest_s_forks_not_the_vmm() {
    let d = require!(microvm_docker());
    let forks = "cat /sys/fs/cgroup/pids.max; \
                 i=0; while [ $i -lt 8 ]; do sleep 30 & i=$((i+1)); done; echo forked";
    // busybox sh gives up with status 2 when it cannot fork.
    let out = d
        .run_rm(&["--pids-limit", "5"], &["sh", "-c", forks])
        .code(2);
    assert!(out.stdout.starts_with("5\n"), "{out}");
    assert!(out.stderr.contains("can't fork"), "8 forks under 5:\n{out}");
}

#[test]
fn run_interactive_tty_with_resize() {
    let d = require!(microvm_docker());
    let mut s = d.interactive(&[
        "run",
        "-it",
        "--rm",
        "--runtime",
        "agentvm",
        rootfs::IMAGE,
        "sh",
    ]);
    s.send("tty; stty size; echo typed-$((6*7))\r");
    s.expect("typed-42", 60);
    let out = s.output();
    assert!(out.contains("/dev/pts/0"), "no pty in the guest:\n{out}");
    assert!(out.contains("40 100"), "initial size not applied:\n{out}");
    s.resize(50, 120);
    let resized = wait_for(30, || {
        s.send("stty size\r");
        std::thread::sleep(Duration::from_millis(500));
        s.output().contains("50 120").then_some(())
    });
    assert!(resized.is_some(), "resize never arrived:\n{}", s.output());
    s.send("exit 3\r");
    assert_eq!(s.wait(60), 3);
}

#[test]
fn exec_runs_inside_the_guest() {
    let d = require!(microvm_docker());
    let c = d.start(
        "mv-exec",
        &[],
        &[
            "sh",
            "-c",
            "echo ready; while [ ! -f /tmp/from-exec ]; do sleep 0.1; done; \
             echo main-saw-$(cat /tmp/from-exec); sleep 300",
        ],
    );
    c.wait_for_log("ready");
    let out = c
        .exec(&[], &["sh", "-c", "uname -r; cat /proc/version"])
        .ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_ne!(
        lines[0],
        common::host_uname_r(),
        "exec ran on the host kernel"
    );
    let host_version = std::fs::read_to_string("/proc/version").expect("version");
    assert_ne!(lines[1], host_version.trim(), "exec saw the host's /proc");
    c.exec(&[], &["sh", "-c", "echo 42 > /tmp/from-exec"]).ok();
    c.wait_for_log("main-saw-42");
    c.exec(&[], &["sh", "-c", "exit 7"]).code(7);
    let id = c.exec(&["-u", "1000:1000"], &["id"]).ok();
    assert!(id.out().starts_with("uid=1000"), "{id}");
    // As under runc: Docker's seccomp profile, without no_new_privs
    // (Docker asks for none), so set-uid programs such as sudo work.
    let status = ["grep", "-E", "^(NoNewPrivs|Seccomp):", "/proc/self/status"];
    for user in ["0", "1000"] {
        let out = c.exec(&["-u", user], &status).ok();
        assert_eq!(out.stdout, "NoNewPrivs:\t0\nSeccomp:\t2\n", "{out}");
    }
    let input = b"one\ntwo\n";
    let exec = ["exec", "-i", c.name.as_str(), "wc", "-l"];
    let out = common::cmd::run_with(
        d.cmd().args(exec),
        Some(input),
        common::cmd::DEFAULT_TIMEOUT,
    )
    .ok();
    assert_eq!(out.out(), "2");
}

#[test]
fn exec_interactive_tty() {
    let d = require!(microvm_docker());
    let c = d.start("mv-exec-it", &[], &["sleep", "300"]);
    let mut s = d.interactive(&["exec", "-it", &c.name, "sh"]);
    s.send("tty; echo typed-$((6*7)); uname -r\r");
    s.expect("typed-42", 60);
    assert!(s.output().contains("/dev/pts/"), "no pty:\n{}", s.output());
    assert!(
        !s.output().contains(&common::host_uname_r()),
        "exec -it ran on the host:\n{}",
        s.output()
    );
    s.send("exit 5\r");
    assert_eq!(s.wait(60), 5);
}

#[test]
fn stop_sends_sigterm_then_kills() {
    let d = require!(microvm_docker());
    let c = d.start(
        "mv-stop",
        &[],
        &[
            "sh",
            "-c",
            "trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.1; done",
        ],
    );
    c.wait_for_log("ready");
    d.run(&["stop", "-t", "30", &c.name]).ok();
    assert_eq!(c.inspect("{{.State.ExitCode}}"), "0");
    c.wait_for_log("got-term");

    let c = d.start(
        "mv-stop-kill",
        &[],
        &["sh", "-c", "trap '' TERM; echo ready; sleep 300"],
    );
    c.wait_for_log("ready");
    d.run(&["stop", "-t", "1", &c.name]).ok();
    assert_eq!(c.inspect("{{.State.ExitCode}}"), "137");
}

#[test]
fn logs_keep_stdout_and_stderr_apart() {
    let d = require!(microvm_docker());
    let c = d.start(
        "mv-logs",
        &[],
        &["sh", "-c", "echo to-out; echo to-err >&2"],
    );
    assert_eq!(c.wait_exit(), 0);
    let logs = d.run(&["logs", &c.name]).ok();
    assert_eq!(logs.stdout, "to-out\n", "{logs}");
    assert_eq!(logs.stderr, "to-err\n", "{logs}");
}

#[test]
fn volume_round_trip() {
    let d = require!(microvm_docker());
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("from-host"), "host-data").expect("write");
    let volume = format!("{}:/data", dir.path().display());
    let out = d
        .run_rm(
            &["-v", &volume],
            &[
                "sh",
                "-c",
                "cat /data/from-host; echo guest-data > /data/from-guest",
            ],
        )
        .ok();
    assert_eq!(out.stdout, "host-data");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("from-guest")).expect("written by the guest"),
        "guest-data\n"
    );
}

#[test]
fn read_only_rootfs() {
    let d = require!(microvm_docker());
    let out = d.run_rm(&["--read-only"], &["sh", "-c", "touch /x"]);
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("Read-only file system"), "{out}");
    d.run_rm(
        &["--read-only"],
        &["sh", "-c", "touch /tmp/x || touch /dev/shm/x"],
    )
    .ok();
}

#[test]
fn user_and_cap_drop() {
    let d = require!(microvm_docker());
    let out = d.run_rm(&["--user", "1000:1000"], &["id"]).ok();
    assert!(out.out().starts_with("uid=1000"), "{out}");
    assert!(out.out().contains("gid=1000"), "{out}");
    let out = d
        .run_rm(
            &["--cap-drop", "ALL"],
            &["grep", "CapEff", "/proc/self/status"],
        )
        .ok();
    assert_eq!(out.out(), "CapEff:\t0000000000000000", "{out}");
    // Without dropping, root in the container has Docker's default set.
    let out = d.run_rm(&[], &["grep", "CapEff", "/proc/self/status"]).ok();
    assert_ne!(out.out(), "CapEff:\t0000000000000000", "{out}");
}

#[test]
fn memory_and_cpus_size_the_guest() {
    let d = require!(microvm_docker());
    let out = d
        .run_rm(
            &["--memory", "256m", "--cpus", "2"],
            &[
                "sh",
                "-c",
                "grep MemTotal /proc/meminfo; nproc; cat /sys/fs/cgroup/memory.max",
            ],
        )
        .ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    let kib: u64 = lines[0]
        .split_whitespace()
        .nth(1)
        .and_then(|k| k.parse().ok())
        .expect("MemTotal kB");
    // Guest RAM is the limit plus a small overhead for the guest kernel.
    assert!(
        (200 * 1024..=400 * 1024).contains(&kib),
        "guest RAM {kib} kB for --memory 256m"
    );
    assert_eq!(lines[1], "2", "vCPUs for --cpus 2");
    assert_eq!(lines[2], "268435456", "the container's own memory limit");
}

/// `docker update` sends zeros for what it leaves alone (a CPU quota and
/// period of 0 with `--memory`): they leave the guest's cgroup v2 values as
/// they are, where written as values they were `max 0` in cpu.max (EINVAL,
/// and the update failed).
#[test]
fn update_changes_the_guest_s_cgroup_field_by_field() {
    let d = require!(microvm_docker());
    let c = d.start("mv-update", &["--memory", "256m"], &["sleep", "300"]);
    let read = || {
        c.exec(
            &[],
            &["cat", "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/cpu.max"],
        )
        .ok()
        .stdout
    };
    d.run(&[
        "update",
        "--memory",
        "200m",
        "--memory-swap",
        "300m",
        &c.name,
    ])
    .ok();
    assert_eq!(read(), format!("{}\nmax 100000\n", 200u64 << 20));
    d.run(&["update", "--cpus", "0.5", &c.name]).ok();
    assert_eq!(read(), format!("{}\n50000 100000\n", 200u64 << 20));
}

#[test]
fn pause_and_unpause_freeze_the_workload() {
    let d = require!(microvm_docker());
    let c = d.start(
        "mv-pause",
        &[],
        &[
            "sh",
            "-c",
            "i=0; while :; do i=$((i+1)); echo tick-$i; sleep 0.2; done",
        ],
    );
    c.wait_for_log("tick-2");
    d.run(&["pause", &c.name]).ok();
    assert_eq!(c.inspect("{{.State.Status}}"), "paused");
    let before = d.run(&["logs", &c.name]).ok().stdout;
    std::thread::sleep(Duration::from_secs(2));
    let after = d.run(&["logs", &c.name]).ok().stdout;
    assert_eq!(before, after, "the workload ran while paused");
    d.run(&["unpause", &c.name]).ok();
    assert_eq!(c.inspect("{{.State.Status}}"), "running");
    let last = before.lines().count();
    c.wait_for_log(&format!("tick-{}", last + 3));
}

#[test]
fn rm_force_removes_a_running_container_and_its_vm() {
    let d = require!(microvm_docker());
    let c = d.start("mv-rmf", &[], &["sleep", "300"]);
    let pid = c.pid();
    assert!(pid > 0);
    let id = c.inspect("{{.Id}}");
    d.run(&["rm", "-f", &c.name]).ok();
    assert!(
        wait_for(30, || common::process_gone(pid).then_some(())).is_some(),
        "the supervisor {pid} outlived docker rm -f"
    );
    let left = common::bundle::processes_with(&id);
    assert!(left.is_empty(), "processes left: {left:?}");
}

#[test]
fn network_none_and_default_bridge_start() {
    let d = require!(microvm_docker());
    let out = d
        .run_rm(&["--network", "none"], &["ls", "/sys/class/net"])
        .ok();
    assert_eq!(out.out(), "lo");
    // On the default bridge the guest has the container's interface
    // (tests/docker_network.rs checks what it can do).
    let out = d.run_rm(&[], &["ls", "/sys/class/net"]).ok();
    assert_eq!(out.out(), "eth0\nlo");
}

/// `--network container:X` (with `--pid container:X`) in the microvm
/// tier runs the new container in X's microVM, as runc runs it in X's
/// namespaces: it reaches X's services on `localhost`, has X's address and
/// sees X's processes. A VM of its own could have neither (its NIC took
/// X's tap name and failed). X runs on when it ends.
#[test]
fn container_network_mode_runs_in_the_other_container_s_vm() {
    let d = require!(microvm_docker());
    let x = d.start(
        "mv-joined",
        &[],
        &[
            "sh",
            "-c",
            "echo from-x > /tmp/index.html; httpd -p 127.0.0.1:8080 -h /tmp; \
             echo ready; exec sleep 300",
        ],
    );
    x.wait_for_log("ready");
    let address = x.inspect("{{.NetworkSettings.IPAddress}}");
    assert!(!address.is_empty(), "X has no address");
    let network = format!("container:{}", x.name);
    let script = "wget -qO- http://127.0.0.1:8080/index.html; \
                  ip -o -4 addr show eth0 | awk '{print $4}'; \
                  ps -o args | grep -c '^sleep 300'; exit 3";
    let out = d
        .run_rm(
            &["--network", &network, "--pid", &network],
            &["sh", "-c", script],
        )
        .code(3);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[0], "from-x", "{out}");
    assert_eq!(lines[1].split('/').next(), Some(address.as_str()), "{out}");
    assert_eq!(lines[2], "1", "X's processes are not in view: {out}");
    // X is untouched by its guest's end.
    assert_eq!(x.inspect("{{.State.Running}}"), "true");
    let again = x
        .exec(&[], &["wget", "-qO-", "http://127.0.0.1:8080/index.html"])
        .ok();
    assert_eq!(again.out(), "from-x");
}

/// Ends the VMs the `agentvm-pool` runtime keeps booted, when dropped.
struct DrainPool(std::path::PathBuf);

impl DrainPool {
    fn agentvm(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(common::agentvm_bin())
            .arg("--root")
            .arg(&self.0)
            .arg("--config")
            .arg(common::docker::pool_config())
            .args(args)
            .output()
            .expect("run agentvm")
    }

    /// The pool's VM that has booted and waits, by slot name.
    fn ready(&self) -> Option<String> {
        std::fs::read_dir(self.0.join(".~pool"))
            .ok()?
            .flatten()
            .find(|s| s.path().join("ready").exists())
            .map(|s| s.file_name().to_string_lossy().into_owned())
    }
}

impl Drop for DrainPool {
    fn drop(&mut self) {
        let _ = self.agentvm(&["pool", "drain"]);
    }
}

#[test]
fn docker_run_takes_booted_vms_from_a_warm_pool() {
    require!(microvm_docker());
    let d = require!(docker_with(Runtime::AgentvmPool));
    let pool = DrainPool(common::docker::runtime_root());
    let out = pool.agentvm(&["pool", "fill", "--wait"]);
    assert!(out.status.success(), "{out:?}");
    let mut seen = Vec::new();
    for round in 0..2 {
        let waiting = wait_for(60, || pool.ready()).expect("a booted VM waits in the pool");
        let out = d
            .run_rm(
                &[],
                &[
                    "sh",
                    "-c",
                    "cat /proc/sys/kernel/random/boot_id; ip -4 -o addr show eth0; exit 3",
                ],
            )
            .code(3);
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(lines.len(), 2, "round {round}: {out}");
        assert_ne!(lines[0], common::host_boot_id(), "the host's kernel");
        assert!(
            lines[1].contains("inet 172.30.213."),
            "round {round}: the guest has the bridge's address: {out}"
        );
        // The VM that waited is the one the container took.
        assert!(
            wait_for(10, || (!common::docker::runtime_root()
                .join(".~pool")
                .join(&waiting)
                .exists())
            .then_some(()))
            .is_some(),
            "round {round}: the waiting VM {waiting} is still in the pool"
        );
        seen.push(lines[0].to_string());
    }
    assert_ne!(seen[0], seen[1], "two containers ran in one VM");
}
