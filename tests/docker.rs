//! Docker end to end: a dedicated dockerd runs containers with the runtime
//! named by `AGENTVM_TEST_RUNTIME` (default `agentvm-container`, i.e.
//! agentvm with `--isolation=container`). Every check here also passes with
//! `AGENTVM_TEST_RUNTIME=runc`, so a failure with agentvm is agentvm's.
//!
//!     cargo test --test docker -- --nocapture
//!     AGENTVM_TEST_RUNTIME=runc cargo test --test docker

use agentvm_test_support as common;
use common::require;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::cgroup::Resource;
use common::docker::docker;
use common::pty::PtySession;
use common::{cmd, rootfs, wait_for};

#[test]
fn run_rm_echo() {
    let d = require!(docker());
    let out = d.run_rm(&[], &["echo", "hello from the container"]).ok();
    assert_eq!(out.stdout, "hello from the container\n");
}

#[test]
fn runtime_runs_the_expected_tier() {
    let d = require!(docker());
    let out = d
        .run_rm(&[], &["cat", "/proc/sys/kernel/random/boot_id"])
        .ok();
    let same = out.out() == common::host_boot_id();
    assert_eq!(same, common::expects_host_kernel(&d.runtime), "{out}");
}

#[test]
fn exit_code_is_propagated() {
    let d = require!(docker());
    d.run_rm(&[], &["sh", "-c", "exit 42"]).code(42);
    d.run_rm(&[], &["true"]).code(0);
    // Docker reads these from the runtime's words (runc's): 127 for a
    // command that is not there, 126 for one that cannot run.
    d.run_rm(&[], &["/no/such/command"]).code(127);
    d.run_rm(&[], &["no-such-command"]).code(127);
    d.run_rm(&[], &["/etc/passwd"]).code(126);
}

#[test]
fn run_interactive_tty() {
    let d = require!(docker());
    let rt = d.runtime.docker_name();
    let mut s = d.interactive(&["run", "-it", "--rm", "--runtime", rt, rootfs::IMAGE, "sh"]);
    s.send("tty; stty size; echo typed-$((6*7))\r");
    s.expect("typed-42", 30);
    let out = s.output();
    assert!(out.contains("/dev/pts/0"), "tty is not /dev/pts/0:\n{out}");
    assert!(
        out.contains("40 100"),
        "initial size 40x100 not applied:\n{out}"
    );
    // A window change reaches the container's terminal.
    s.resize(50, 120);
    let resized = wait_for(20, || {
        s.send("stty size\r");
        std::thread::sleep(Duration::from_millis(300));
        s.output().contains("50 120").then_some(())
    });
    assert!(resized.is_some(), "resize never arrived:\n{}", s.output());
    s.send("exit 3\r");
    assert_eq!(s.wait(30), 3);
    assert!(!s.output().contains('\0'), "NUL in terminal output");
}

#[test]
fn run_tty_short_lived_output_is_complete() {
    let d = require!(docker());
    let rt = d.runtime.docker_name();
    let mut cmd = d.cmd();
    cmd.args(["run", "-t", "--rm", "--runtime", rt, rootfs::IMAGE])
        .args(["sh", "-c", "echo first-line; echo last-line; exit 4"]);
    let mut s = PtySession::spawn(cmd, 24, 80);
    assert_eq!(s.wait(60), 4, "terminal output:\n{}", s.output());
    // Without -i the client leaves our terminal cooked, so line endings
    // pass through two ptys: compare without the carriage returns.
    let out = s.output();
    assert!(
        out.replace('\r', "").contains("first-line\nlast-line\n"),
        "{out:?}"
    );
    assert!(!out.contains('\0'), "NUL in terminal output: {out:?}");
}

#[test]
fn exec_runs_inside_the_container() {
    let d = require!(docker());
    let c = d.start("exec", &[], &["sleep", "300"]);
    let hostname = c.inspect("{{.Config.Hostname}}");
    let out = c
        .exec(
            &[],
            &["sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline; echo; hostname"],
        )
        .ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines, ["sleep 300 ", hostname.as_str()], "{out}");
    c.exec(&[], &["sh", "-c", "exit 7"]).code(7);
    let id = c.exec(&["-u", "1000:1000"], &["id"]).ok();
    assert!(
        id.out().starts_with("uid=1000(user) gid=1000(user)"),
        "{id}"
    );
    // As under runc: Docker's seccomp profile, without no_new_privs
    // (Docker asks for none), so set-uid programs such as sudo work.
    let status = ["grep", "-E", "^(NoNewPrivs|Seccomp):", "/proc/self/status"];
    for user in ["0", "1000"] {
        let out = c.exec(&["-u", user], &status).ok();
        assert_eq!(out.stdout, "NoNewPrivs:\t0\nSeccomp:\t2\n", "{out}");
    }
}

#[test]
fn exec_interactive_tty() {
    let d = require!(docker());
    let c = d.start("exec-it", &[], &["sleep", "300"]);
    let mut s = d.interactive(&["exec", "-it", &c.name, "sh"]);
    s.send("tty; echo typed-$((6*7)); tr '\\0' ' ' < /proc/1/cmdline; echo\r");
    s.expect("typed-42", 30);
    s.expect("sleep 300", 10);
    assert!(s.output().contains("/dev/pts/"), "no pty:\n{}", s.output());
    s.send("exit 5\r");
    assert_eq!(s.wait(30), 5);
    let out = s.output();
    assert!(!out.contains('\0'), "NUL in terminal output: {out:?}");
}

#[test]
fn stdin_is_piped_without_a_tty() {
    let d = require!(docker());
    let rt = d.runtime.docker_name();
    let input = b"first line\nsecond line\n";
    let args = ["run", "-i", "--rm", "--runtime", rt, rootfs::IMAGE, "cat"];
    let out = cmd::run_with(d.cmd().args(args), Some(input), cmd::DEFAULT_TIMEOUT).ok();
    assert_eq!(out.stdout.as_bytes(), input);
    let c = d.start("exec-i", &[], &["sleep", "300"]);
    let exec = ["exec", "-i", c.name.as_str(), "wc", "-l"];
    let out = cmd::run_with(d.cmd().args(exec), Some(input), cmd::DEFAULT_TIMEOUT).ok();
    assert_eq!(out.out(), "2");
}

#[test]
fn env_workdir_and_hostname() {
    let d = require!(docker());
    let out = d
        .run_rm(
            &[
                "-e",
                "GREETING=hi there",
                "-w",
                "/tmp",
                "--hostname",
                "avmhost",
            ],
            &["sh", "-c", "echo \"$GREETING\"; pwd; hostname; echo $PATH"],
        )
        .ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[..3], ["hi there", "/tmp", "avmhost"], "{out}");
    assert!(lines[3].contains("/bin"), "no PATH: {out}");
    let c = d.start("exec-env", &["-e", "FROM_RUN=1"], &["sleep", "300"]);
    let out = c
        .exec(
            &["-e", "FROM_EXEC=2", "-w", "/etc"],
            &["sh", "-c", "echo $FROM_RUN$FROM_EXEC; pwd"],
        )
        .ok();
    assert_eq!(out.stdout, "12\n/etc\n");
}

#[test]
fn kill_delivers_a_chosen_signal() {
    let d = require!(docker());
    let script = "trap 'echo got-usr1' USR1; echo ready; \
                  while :; do sleep 1 & wait $!; done";
    let c = d.start("kill", &[], &["sh", "-c", script]);
    c.wait_for_log("ready");
    d.run(&["kill", "-s", "USR1", &c.name]).ok();
    c.wait_for_log("got-usr1");
    assert_eq!(c.inspect("{{.State.Status}}"), "running");
    d.run(&["kill", &c.name]).ok();
    assert_eq!(c.wait_exit(), 137);
}

#[test]
fn restart_runs_the_container_again() {
    let d = require!(docker());
    let c = d.start(
        "restart",
        &[],
        &["sh", "-c", "echo started; exec sleep 300"],
    );
    c.wait_for_log("started");
    let first = c.pid();
    d.run(&["restart", "-t", "1", &c.name]).ok();
    assert_eq!(c.inspect("{{.State.Status}}"), "running");
    assert_ne!(c.pid(), first, "same pid after restart");
    let logs = wait_for(30, || {
        let logs = d.run(&["logs", &c.name]).ok();
        (logs.stdout.matches("started").count() == 2).then_some(())
    });
    assert!(logs.is_some(), "the workload did not run twice");
}

#[test]
fn init_flag_runs_docker_init_as_pid_1() {
    let d = require!(docker());
    let out = d
        .run_rm(&["--init"], &["sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline"])
        .ok();
    assert!(
        out.stdout.starts_with("/sbin/docker-init -- sh -c"),
        "{out}"
    );
}

#[test]
fn stop_delivers_sigterm_to_a_trap() {
    let d = require!(docker());
    let script = "trap 'echo got-sigterm; exit 0' TERM; echo ready; \
                  while :; do sleep 1 & wait $!; done";
    let c = d.start("stop-term", &[], &["sh", "-c", script]);
    c.wait_for_log("ready");
    d.run(&["stop", "-t", "60", &c.name]).ok();
    assert_eq!(c.inspect("{{.State.ExitCode}}"), "0");
    let logs = d.run(&["logs", &c.name]).ok();
    assert!(logs.stdout.contains("got-sigterm"), "{logs}");
}

#[test]
fn stop_kills_a_container_ignoring_sigterm() {
    let d = require!(docker());
    let script = "trap '' TERM; echo ready; while :; do sleep 1; done";
    let c = d.start("stop-kill", &[], &["sh", "-c", script]);
    c.wait_for_log("ready");
    d.run(&["stop", "-t", "2", &c.name]).ok();
    assert_eq!(c.inspect("{{.State.Status}}"), "exited");
    assert_eq!(c.inspect("{{.State.ExitCode}}"), "137");
}

#[test]
fn logs_keep_stdout_and_stderr_apart() {
    let d = require!(docker());
    let c = d.start(
        "logs",
        &[],
        &[
            "sh",
            "-c",
            "echo to-stdout; echo to-stderr >&2; echo more-stdout",
        ],
    );
    assert_eq!(c.wait_exit(), 0);
    let logs = d.run(&["logs", &c.name]).ok();
    assert_eq!(logs.stdout, "to-stdout\nmore-stdout\n", "{logs}");
    assert_eq!(logs.stderr, "to-stderr\n", "{logs}");
}

/// One HTTP GET on 127.0.0.1:port; None until the server answers.
fn http_get(port: u16) -> Option<String> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    conn.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").ok()?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply).ok()?;
    reply.contains("200 OK").then_some(reply)
}

#[test]
fn published_port_is_reachable_on_loopback() {
    let d = require!(docker());
    let server = "mkdir -p /www && echo served-by-container > /www/index.html \
                  && exec httpd -f -p 8080 -h /www";
    let c = d.start("port", &["-p", "127.0.0.1::8080"], &["sh", "-c", server]);
    let mapping = d.run(&["port", &c.name, "8080/tcp"]).ok();
    let port: u16 = mapping
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("127.0.0.1:"))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no 127.0.0.1 mapping:\n{mapping}"));
    let reply = wait_for(30, || http_get(port));
    let reply = reply.unwrap_or_else(|| panic!("no HTTP answer on 127.0.0.1:{port}"));
    assert!(reply.contains("served-by-container"), "{reply}");
}

#[test]
fn bridge_network_reaches_the_gateway() {
    let d = require!(docker());
    let gateway = d.bridge_gateway();
    assert!(!gateway.is_empty(), "bridge network has no gateway");
    let prefix = gateway.rsplit_once('.').map(|(net, _)| net).unwrap_or("");
    let script = format!("ip -o -4 addr show eth0 && ping -c 1 -W 5 {gateway}");
    let out = d.run_rm(&[], &["sh", "-c", &script]).ok();
    assert!(out.stdout.contains(&format!("inet {prefix}.")), "{out}");
    assert!(out.stdout.contains("1 packets received"), "{out}");
}

#[test]
fn network_none_has_only_loopback() {
    let d = require!(docker());
    let out = d
        .run_rm(&["--network", "none"], &["ls", "/sys/class/net"])
        .ok();
    assert_eq!(out.out(), "lo");
    let out = d.run_rm(&["--network", "none"], &["ip", "-o", "link"]).ok();
    assert_eq!(out.stdout.lines().count(), 1, "{out}");
}

#[test]
fn joins_another_containers_network_and_pid_namespaces() {
    let d = require!(docker());
    let first = d.start("ns-owner", &[], &["sleep", "301"]);
    let owner_ip = first.inspect("{{.NetworkSettings.IPAddress}}");
    assert!(!owner_ip.is_empty(), "first container has no address");
    let net = format!("container:{}", first.name);
    let out = d
        .run_rm(
            &["--network", &net, "--pid", &net],
            &["sh", "-c", "ip -o -4 addr show eth0; ps"],
        )
        .ok();
    assert!(out.stdout.contains(&format!("inet {owner_ip}/")), "{out}");
    assert!(out.stdout.contains("sleep 301"), "{out}");
}

#[test]
fn bind_volume_is_shared_with_the_host() {
    let d = require!(docker());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("from-host"), "written-on-host\n").unwrap();
    let volume = format!("{}:/data", dir.path().display());
    let out = d
        .run_rm(
            &["-v", &volume],
            &[
                "sh",
                "-c",
                "cat /data/from-host && echo written-inside > /data/f",
            ],
        )
        .ok();
    assert_eq!(out.stdout, "written-on-host\n");
    let inside = std::fs::read_to_string(dir.path().join("f")).unwrap();
    assert_eq!(inside, "written-inside\n");
}

#[test]
fn read_only_rootfs() {
    let d = require!(docker());
    d.run_rm(&[], &["touch", "/newfile"]).ok();
    let out = d.run_rm(&["--read-only"], &["touch", "/newfile"]);
    assert!(
        !out.success(),
        "write to a read-only rootfs succeeded:\n{out}"
    );
    assert!(out.stderr.contains("Read-only file system"), "{out}");
    let mounts = d
        .run_rm(&["--read-only"], &["grep", " / ", "/proc/mounts"])
        .ok();
    assert!(
        mounts.stdout.contains(" ro,") || mounts.stdout.contains(" ro "),
        "{mounts}"
    );
}

#[test]
fn read_only_rootfs_with_a_tmpfs() {
    let d = require!(docker());
    let out = d
        .run_rm(
            &["--read-only", "--tmpfs", "/run:size=1m"],
            &[
                "sh",
                "-c",
                "echo x > /run/f && cat /run/f && grep ' /run ' /proc/mounts",
            ],
        )
        .ok();
    assert!(out.stdout.starts_with("x\ntmpfs /run tmpfs rw,"), "{out}");
}

#[test]
fn ulimit_flag_sets_rlimits() {
    let d = require!(docker());
    let out = d
        .run_rm(
            &["--ulimit", "nofile=1024:2048"],
            &["sh", "-c", "ulimit -n; ulimit -Hn"],
        )
        .ok();
    assert_eq!(out.stdout, "1024\n2048\n");
}

/// Paths Docker masks by default (bind of /dev/null or an empty
/// read-only tmpfs), limited to those this host's /proc has.
fn masked_paths_on_host() -> Vec<&'static str> {
    [
        "/proc/acpi",
        "/proc/kcore",
        "/proc/keys",
        "/proc/latency_stats",
        "/proc/timer_list",
        "/proc/timer_stats",
        "/proc/sched_debug",
        "/proc/scsi",
    ]
    .into_iter()
    .filter(|p| std::path::Path::new(p).exists())
    .collect()
}

#[test]
fn default_hardening_matches_docker_defaults() {
    let d = require!(docker());
    let script = "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; \
                  grep -E ' /proc/(sys|sysrq-trigger) ' /proc/mounts";
    let out = d.run_rm(&[], &["sh", "-c", script]).ok();
    // Docker's default capability set and seccomp filter, /proc/sys
    // read-only.
    assert!(out.stdout.contains("CapEff:\t00000000a80425fb"), "{out}");
    assert!(out.stdout.contains("Seccomp:\t2"), "{out}");
    assert!(out.stdout.contains("NoNewPrivs:\t0"), "{out}");
    assert!(out.stdout.contains(" /proc/sys proc ro,"), "{out}");

    let masked = masked_paths_on_host();
    let check = masked
        .iter()
        .map(|p| {
            format!(
                "if [ -d {p} ]; then echo {p} $(ls {p} | wc -l); else echo {p} $(wc -c < {p}); fi"
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let out = d.run_rm(&[], &["sh", "-c", &check]).ok();
    let want: Vec<String> = masked.iter().map(|p| format!("{p} 0")).collect();
    assert_eq!(out.stdout.lines().collect::<Vec<_>>(), want, "{out}");

    let out = d
        .run_rm(
            &[
                "--security-opt",
                "seccomp=unconfined",
                "--security-opt",
                "no-new-privileges",
            ],
            &["grep", "-E", "^(NoNewPrivs|Seccomp):", "/proc/self/status"],
        )
        .ok();
    assert_eq!(out.stdout, "NoNewPrivs:\t1\nSeccomp:\t0\n");
}

#[test]
fn cap_add_and_the_default_seccomp_profile() {
    let d = require!(docker());
    // mount needs CAP_SYS_ADMIN, which Docker withholds (its seccomp
    // profile allows mount only with it); --cap-add grants it.
    let mount = [
        "sh",
        "-c",
        "mkdir -p /mnt/t && mount -t tmpfs none /mnt/t && echo mounted",
    ];
    let denied = d.run_rm(&[], &mount);
    assert!(
        !denied.success(),
        "mount succeeded without CAP_SYS_ADMIN:\n{denied}"
    );
    let granted = d.run_rm(&["--cap-add", "SYS_ADMIN"], &mount).ok();
    assert_eq!(granted.out(), "mounted");
    // unshare(CLONE_NEWUSER) needs no capability, so only the seccomp
    // profile stops it; unconfined, it works.
    let out = d.run_rm(&[], &["unshare", "-U", "true"]);
    assert!(
        !out.success(),
        "unshare(CLONE_NEWUSER) allowed by the default profile:\n{out}"
    );
    d.run_rm(
        &["--security-opt", "seccomp=unconfined"],
        &["unshare", "-U", "true"],
    )
    .ok();
}

#[test]
fn user_flag_sets_uid_and_gid() {
    let d = require!(docker());
    let out = d.run_rm(&["--user", "1000:1000"], &["id"]).ok();
    assert!(
        out.out().starts_with("uid=1000(user) gid=1000(user)"),
        "{out}"
    );
    let out = d.run_rm(&["--user", "1000:1000"], &["touch", "/etc/x"]);
    assert!(out.stderr.contains("Permission denied"), "{out}");
}

#[test]
fn cap_drop_all_removes_capabilities() {
    let d = require!(docker());
    let chown = ["sh", "-c", "touch /f && chown 1000:1000 /f && echo chowned"];
    let with_caps = d.run_rm(&[], &chown).ok();
    assert_eq!(with_caps.out(), "chowned");
    let without = d.run_rm(&["--cap-drop", "ALL"], &chown);
    assert!(
        !without.success(),
        "chown succeeded without CAP_CHOWN:\n{without}"
    );
    assert!(
        without.stderr.contains("Operation not permitted"),
        "{without}"
    );
    let caps = d
        .run_rm(
            &["--cap-drop", "ALL"],
            &["grep", "^Cap", "/proc/self/status"],
        )
        .ok();
    for set in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        let line = format!("{set}:\t0000000000000000");
        assert!(caps.stdout.contains(&line), "{set} not empty:\n{caps}");
    }
}

#[test]
fn memory_limit_is_set_in_the_cgroup() {
    let d = require!(docker());
    let c = d.start("mem", &["--memory", "64m"], &["sleep", "300"]);
    assert_eq!(c.cgroup(Resource::MemoryLimit), (64u64 << 20).to_string());
}

#[test]
fn memory_limit_oom_kills_with_137() {
    let d = require!(docker());
    // dd fills a 200 MiB buffer from /dev/zero: far over 64 MiB (+swap).
    let c = d.start(
        "oom",
        &["--memory", "64m", "--memory-swap", "64m"],
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"],
    );
    assert_eq!(c.wait_exit(), 137);
    assert_eq!(c.inspect("{{.State.OOMKilled}}"), "true");
}

#[test]
fn pids_limit_caps_forks() {
    let d = require!(docker());
    let c = d.start("pids", &["--pids-limit", "10"], &["sleep", "300"]);
    assert_eq!(c.cgroup(Resource::PidsMax), "10");
    let forks = "i=0; while [ $i -lt 20 ]; do sleep 30 & i=$((i+1)); done; echo done";
    let out = c.exec(&[], &["sh", "-c", forks]);
    assert!(
        out.stderr.contains("can't fork"),
        "20 forks under a limit of 10:\n{out}"
    );
}

#[test]
fn cpus_sets_the_cfs_quota() {
    let d = require!(docker());
    let c = d.start("cpus", &["--cpus", "0.5"], &["sleep", "300"]);
    assert_eq!(c.cgroup(Resource::CpuQuota), "50000 100000");
}

#[test]
fn pause_freezes_and_unpause_resumes() {
    let d = require!(docker());
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("c");
    let volume = format!("{}:/data", dir.path().display());
    let script = "i=0; while :; do i=$((i+1)); echo $i > /data/c.new; \
                  mv /data/c.new /data/c; sleep 0.1; done";
    let c = d.start("pause", &["-v", &volume], &["sh", "-c", script]);
    let read = || std::fs::read_to_string(&counter).ok();
    assert!(wait_for(30, read).is_some(), "counter never written");

    d.run(&["pause", &c.name]).ok();
    assert_eq!(c.inspect("{{.State.Status}}"), "paused");
    assert_eq!(c.cgroup(Resource::Frozen), "1");
    let frozen_at = read();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(read(), frozen_at, "the counter moved while paused");

    d.run(&["unpause", &c.name]).ok();
    assert_eq!(c.inspect("{{.State.Status}}"), "running");
    assert_eq!(c.cgroup(Resource::Frozen), "0");
    let moved = wait_for(10, || (read() != frozen_at).then_some(()));
    assert!(moved.is_some(), "the counter did not move after unpause");
}

#[test]
fn stats_and_top() {
    let d = require!(docker());
    let c = d.start("stats", &["--memory", "64m"], &["sleep", "300"]);
    let stats = d
        .run(&["stats", "--no-stream", "--format", "{{.MemUsage}}", &c.name])
        .ok();
    let (usage, limit) = stats
        .out()
        .split_once(" / ")
        .unwrap_or_else(|| panic!("bad MemUsage:\n{stats}"));
    assert_eq!(limit, "64MiB", "{stats}");
    assert_ne!(usage, "0B", "{stats}");
    let top = d.run(&["top", &c.name]).ok();
    let pid = c.pid().to_string();
    let line = top
        .stdout
        .lines()
        .find(|l| l.contains("sleep 300"))
        .unwrap_or_else(|| panic!("sleep 300 not in top:\n{top}"));
    assert!(
        line.split_whitespace().any(|f| f == pid),
        "pid {pid}:\n{top}"
    );
}

#[test]
fn update_memory_changes_the_cgroup() {
    let d = require!(docker());
    let c = d.start("update", &["--memory", "64m"], &["sleep", "300"]);
    d.run(&[
        "update",
        "--memory",
        "128m",
        "--memory-swap",
        "256m",
        &c.name,
    ])
    .ok();
    assert_eq!(c.cgroup(Resource::MemoryLimit), (128u64 << 20).to_string());
    assert_eq!(
        c.inspect("{{.HostConfig.Memory}}"),
        (128u64 << 20).to_string()
    );
    // Docker sends every field, zeros for what it leaves alone: a CPU
    // quota and period of 0 with the memory above, the memory limit with
    // the CPUs here. Zeros leave a value as it is (on cgroup v2, written
    // as values, they were `max 0` in cpu.max: EINVAL).
    d.run(&["update", "--cpus", "0.5", &c.name]).ok();
    assert_eq!(c.cgroup(Resource::CpuQuota), "50000 100000");
    assert_eq!(c.cgroup(Resource::MemoryLimit), (128u64 << 20).to_string());
    d.run(&[
        "update",
        "--memory",
        "96m",
        "--memory-swap",
        "192m",
        &c.name,
    ])
    .ok();
    assert_eq!(c.cgroup(Resource::MemoryLimit), (96u64 << 20).to_string());
    assert_eq!(c.cgroup(Resource::CpuQuota), "50000 100000");
}

#[test]
fn rm_force_removes_a_paused_container() {
    let d = require!(docker());
    let c = d.start("rm-paused", &[], &["sleep", "300"]);
    let pid = c.pid();
    d.run(&["pause", &c.name]).ok();
    d.run(&["rm", "-f", &c.name]).ok();
    let filter = format!("name=^/{}$", c.name);
    let left = d.run(&["ps", "-a", "-q", "--filter", &filter]).ok();
    assert_eq!(left.out(), "", "container still listed");
    assert!(
        process_gone(pid, "sleep"),
        "the paused process {pid} survived rm -f"
    );
}

/// Waits up to 10 s for `pid` to no longer be a `comm` process.
fn process_gone(pid: i32, comm: &str) -> bool {
    wait_for(10, || {
        let now = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        (now.trim() != comm).then_some(())
    })
    .is_some()
}

#[test]
fn rm_force_kills_and_removes() {
    let d = require!(docker());
    let c = d.start("rm", &["--memory", "64m"], &["sleep", "300"]);
    let pid = c.pid();
    let cgroup = c.cgroup_dir("memory");
    d.run(&["rm", "-f", &c.name]).ok();
    let filter = format!("name=^/{}$", c.name);
    let left = d.run(&["ps", "-a", "-q", "--filter", &filter]).ok();
    assert_eq!(left.out(), "", "container still listed");
    assert!(
        process_gone(pid, "sleep"),
        "the container's process {pid} survived rm -f"
    );
    let removed = wait_for(10, || (!cgroup.exists()).then_some(()));
    assert!(removed.is_some(), "cgroup {} left behind", cgroup.display());
}
