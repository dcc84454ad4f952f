//! The microvm tier through agentvm's own command line: each container
//! boots its own kernel (QEMU microvm, TCG on our machines), the supervisor
//! is the container's pid, exec runs in the guest, and every fault — a
//! missing kernel, a guest kernel panic, the supervisor or the VMM killed —
//! ends as a stopped container that `delete` removes without a trace.
//!
//! Needs root, qemu-system-x86_64, virtiofsd (`make virtiofsd`) and the
//! kernel `kernels/build.sh` builds (`make kernel`); without them each test
//! prints `skipped: <why>`.

use agentvm_test_support as common;
use common::require;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::bundle::{assert_nothing_left, assert_one_clear_error, processes_with, Fixture};
use common::wait_for;

/// A fixture whose commands run the microvm tier with the kernel built by
/// kernels/build.sh, and a host directory mounted at /out in the guest.
fn microvm() -> Result<Fixture, String> {
    if let Some(why) = common::host_unsuitable(&[]) {
        return Err(why);
    }
    if let Some(why) = common::guest::unavailable() {
        return Err(why);
    }
    let kernel = common::guest::kernel()?;
    let mut f = Fixture::with_flags(&["--isolation=microvm"]);
    let config = f.dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[microvm]\nkernel = {:?}\nvirtiofsd = {:?}\n",
            kernel.display().to_string(),
            common::guest::VIRTIOFSD
        ),
    )
    .expect("write config.toml");
    f.add_flags(&["--config", config.to_str().expect("utf-8")]);
    std::fs::create_dir(out_dir(&f)).expect("out dir");
    Ok(f)
}

fn out_dir(f: &Fixture) -> PathBuf {
    f.dir.path().join("out")
}

/// Writes a bundle running `script` with `sh -c`, with the fixture's out
/// directory bind-mounted read-write at /out, and /sys with the cgroup
/// file system.
fn write_script(f: &Fixture, script: &str) {
    let out = out_dir(f);
    f.write_config(&["sh", "-c", script], |c| {
        c["mounts"].as_array_mut().expect("mounts").extend([
            serde_json::json!({
                "destination": "/out", "type": "bind",
                "source": out, "options": ["rbind", "rw"]
            }),
            serde_json::json!({
                "destination": "/sys", "type": "sysfs", "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"]
            }),
            serde_json::json!({
                "destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]
            }),
        ]);
    });
}

fn bundle_arg(f: &Fixture) -> String {
    f.bundle().to_str().expect("utf-8").to_string()
}

/// Waits until `file` exists in the out directory.
#[track_caller]
fn wait_for_file(f: &Fixture, file: &str) -> String {
    let path = out_dir(f).join(file);
    wait_for(60, || std::fs::read_to_string(&path).ok())
        .unwrap_or_else(|| panic!("{} never appeared", path.display()))
}

#[track_caller]
fn wait_for_status(f: &Fixture, id: &str, status: &str) {
    let seen = wait_for(60, || {
        let s = f.state(id);
        (s["status"] == status).then_some(())
    });
    assert!(
        seen.is_some(),
        "container {id} never became {status}: {}",
        f.state(id)
    );
}

fn pid_of(f: &Fixture, id: &str) -> i32 {
    f.state(id)["pid"].as_i64().expect("pid") as i32
}

fn log_text(f: &Fixture) -> String {
    std::fs::read_to_string(f.log()).unwrap_or_default()
}

/// The host pid of this container's QEMU (its command line names the
/// container's state directory).
fn qemu_pid(id: &str) -> Option<i32> {
    processes_with(id)
        .iter()
        .find(|p| p.contains("qemu-system"))
        .and_then(|p| p.split(':').next()?.parse().ok())
}

fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a pid the test just looked up.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill {pid}");
}

#[test]
fn run_boots_its_own_kernel_and_returns_the_exit_code() {
    let f = require!(microvm());
    write_script(
        &f,
        "uname -r; cat /proc/sys/kernel/random/boot_id; echo to-stderr >&2; exit 7",
    );
    let out = f.agentvm(&["run", "--bundle", &bundle_arg(&f), "mv-run"]);
    assert_eq!(out.code, 7, "{out}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_ne!(
        lines[0],
        common::host_uname_r(),
        "the guest runs the host's kernel"
    );
    assert_ne!(lines[1], common::host_boot_id(), "same boot id as the host");
    assert!(out.stderr.contains("to-stderr"), "{out}");
    assert_nothing_left(&f, "mv-run");
}

#[test]
fn lifecycle_with_exec_inside_the_guest() {
    let f = require!(microvm());
    let id = "mv-life";
    write_script(
        &f,
        "echo started > /out/started; \
         trap 'echo term > /out/term; exit 3' TERM; \
         while :; do sleep 0.1; done",
    );
    let pid_file = f.dir.path().join("pid");
    let out = f.agentvm(&[
        "create",
        "--bundle",
        &bundle_arg(&f),
        "--pid-file",
        pid_file.to_str().expect("utf-8"),
        id,
    ]);
    assert!(out.success(), "{out}");
    let state = f.state(id);
    assert_eq!(state["status"], "created", "{state}");
    let pid = pid_of(&f, id);
    assert!(pid > 0);
    assert_eq!(
        std::fs::read_to_string(&pid_file).expect("pid file"),
        pid.to_string()
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !out_dir(&f).join("started").exists(),
        "the workload ran before start"
    );

    f.agentvm(&["start", id]).ok();
    wait_for_file(&f, "started");
    assert_eq!(f.state(id)["status"], "running");

    // exec runs in the guest: its kernel, and its writes are the
    // container's.
    let out = f
        .agentvm(&[
            "exec",
            id,
            "sh",
            "-c",
            "uname -r; echo from-exec > /out/exec; cat /out/started",
        ])
        .ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_ne!(
        lines[0],
        common::host_uname_r(),
        "exec ran on the host kernel"
    );
    assert_eq!(lines[1], "started", "{out}");
    assert_eq!(wait_for_file(&f, "exec").trim(), "from-exec");

    let out = f.agentvm(&["exec", id, "sh", "-c", "echo oops >&2; exit 5"]);
    assert_eq!(out.code, 5, "{out}");
    assert!(out.stderr.contains("oops"), "{out}");

    let out = f.agentvm(&["exec", id, "/no/such/binary"]);
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("/no/such/binary"), "{out}");

    // A detached exec: the pid file names a relay that lives as long as
    // the guest process.
    let exec_pid = f.dir.path().join("exec.pid");
    f.agentvm(&[
        "exec",
        "--detach",
        "--pid-file",
        exec_pid.to_str().expect("utf-8"),
        id,
        "sh",
        "-c",
        "sleep 1; echo detached > /out/detached",
    ])
    .ok();
    let relay: i32 = std::fs::read_to_string(&exec_pid)
        .expect("exec pid file")
        .trim()
        .parse()
        .expect("pid");
    assert_eq!(wait_for_file(&f, "detached").trim(), "detached");
    assert!(
        wait_for(30, || common::process_gone(relay).then_some(())).is_some(),
        "the exec relay {relay} outlived its process"
    );

    // update changes the container's limits in the guest; a bigger VM
    // than the one booted is refused.
    f.agentvm(&["update", "--memory", "100m", "--pids-limit", "50", id])
        .ok();
    let limits = f
        .agentvm(&[
            "exec",
            id,
            "cat",
            "/sys/fs/cgroup/memory.max",
            "/sys/fs/cgroup/pids.max",
        ])
        .ok();
    assert_eq!(limits.stdout, format!("{}\n50\n", 100 << 20), "{limits}");
    let out = f.agentvm(&["update", "--memory", "64g", id]);
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("fixed at create"), "{out}");

    let events = f.agentvm(&["events", "--stats", id]).ok();
    let event: serde_json::Value = serde_json::from_str(events.out()).expect("event JSON");
    assert_eq!(event["type"], "stats", "{events}");
    assert_eq!(event["id"], id, "{events}");
    assert!(
        event["data"]["memory"]["usage"]["usage"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "no memory use reported: {events}"
    );
    assert_eq!(
        event["data"]["memory"]["usage"]["limit"],
        100 << 20,
        "the limit set by update: {events}"
    );

    // ps: the table lists the guest's processes; the JSON the VM's host
    // processes, the supervisor (the container's pid) among them.
    let ps = f.agentvm(&["ps", id]).ok();
    assert!(ps.stdout.starts_with("    PID    PPID    UID CMD"), "{ps}");
    assert!(
        ps.stdout.lines().any(|l| l.contains("sh -c echo started")),
        "the workload is not in the guest's process list:\n{ps}"
    );
    let ps = f.agentvm(&["ps", "--format", "json", id]).ok();
    let pids: Vec<i32> = serde_json::from_str(&ps.stdout).expect("ps json");
    assert!(
        pids.contains(&pid),
        "the supervisor {pid} is not listed: {ps}"
    );

    // kill forwards the signal to the workload in the guest.
    f.agentvm(&["kill", id, "TERM"]).ok();
    assert_eq!(wait_for_file(&f, "term").trim(), "term");
    wait_for_status(&f, id, "stopped");
    assert_eq!(f.state(id)["pid"], 0);
    f.agentvm(&["delete", id]).ok();
    assert_nothing_left(&f, id);
}

#[test]
fn missing_kernel_is_a_clear_error_and_leaves_nothing() {
    let f = require!(microvm());
    std::fs::write(
        f.dir.path().join("config.toml"),
        "[microvm]\nkernel = \"/nonexistent/agentvm/vmlinux\"\n",
    )
    .expect("config");
    write_script(&f, "true");
    let out = f.create("mv-nokernel");
    assert_one_clear_error(&f, &out, "make kernel");
    assert!(out.stderr.contains("/nonexistent/agentvm/vmlinux"), "{out}");
    assert_nothing_left(&f, "mv-nokernel");
}

/// Starts a container that sleeps, for the fault tests.
fn start_sleeper(f: &Fixture, id: &str) {
    write_script(f, "echo up > /out/up; exec sleep 1000");
    f.create(id).ok();
    f.agentvm(&["start", id]).ok();
    wait_for_file(f, "up");
}

#[test]
fn supervisor_killed_ends_as_stopped_and_delete_cleans_up() {
    let f = require!(microvm());
    let id = "mv-supkill";
    start_sleeper(&f, id);
    let qemu = qemu_pid(id).expect("a QEMU process for the container");
    kill(pid_of(&f, id), libc::SIGKILL);
    wait_for_status(&f, id, "stopped");
    // The VMM dies with its supervisor.
    assert!(
        wait_for(10, || common::process_gone(qemu).then_some(())).is_some(),
        "QEMU {qemu} outlived its supervisor"
    );
    f.agentvm(&["delete", id]).ok();
    assert_nothing_left(&f, id);
}

#[test]
fn vmm_killed_ends_the_container_with_a_log_line() {
    let f = require!(microvm());
    let id = "mv-vmmkill";
    start_sleeper(&f, id);
    let qemu = qemu_pid(id).expect("a QEMU process for the container");
    kill(qemu, libc::SIGKILL);
    wait_for_status(&f, id, "stopped");
    let log = log_text(&f);
    assert!(
        log.contains("exited unexpectedly") && log.contains("\"level\":\"error\""),
        "no error line about the VMM in the log:\n{log}"
    );
    f.agentvm(&["delete", id]).ok();
    assert_nothing_left(&f, id);
}

#[test]
fn guest_kernel_panic_ends_the_container() {
    let f = require!(microvm());
    let id = "mv-panic";
    write_script(
        &f,
        "echo up > /out/up; echo c > /proc/sysrq-trigger; sleep 1000",
    );
    let out = f.agentvm(&["run", "--bundle", &bundle_arg(&f), id]);
    assert!(
        out_dir(&f).join("up").exists(),
        "the workload never ran: {out}"
    );
    assert_eq!(out.code, 255, "{out}");
    let log = log_text(&f);
    assert!(
        log.contains("exited unexpectedly") && log.contains("\"level\":\"error\""),
        "no error line about the VM in the log:\n{log}"
    );
    assert_nothing_left(&f, id);
}

/// A file outside everything the container was given, and links to it
/// planted in the container's own volume.
fn plant_escape_routes(f: &Fixture) -> (PathBuf, String) {
    let secret_dir = f.dir.path().join("secret");
    std::fs::create_dir(&secret_dir).expect("secret dir");
    let marker = format!("host-secret-{}", std::process::id());
    let secret = secret_dir.join("file");
    std::fs::write(&secret, &marker).expect("secret");
    let out = out_dir(f);
    std::os::unix::fs::symlink(&secret, out.join("abs-link")).expect("symlink");
    std::os::unix::fs::symlink("../secret/file", out.join("rel-link")).expect("symlink");
    std::os::unix::fs::symlink("/", out.join("root-link")).expect("symlink");
    (secret, marker)
}

#[test]
fn guest_cannot_reach_host_files_through_the_share() {
    let f = require!(microvm());
    let (secret, marker) = plant_escape_routes(&f);
    let secret = secret.display().to_string();
    // Each attempt prints what it read; none may print the marker (the
    // script does not hold it). A search of the guest's whole tree must not
    // find the host file's path either.
    let script = format!(
        "cat /out/abs-link /out/rel-link /out/root-link{secret} 2>/dev/null; \
         cat /out/../secret/file /out/../../secret/file {secret} 2>/dev/null; \
         cat /out/../../../../../../..{secret} 2>/dev/null; \
         cat /proc/self/root{secret} /proc/1/root{secret} 2>/dev/null; \
         ln {secret} /out/hard 2>/dev/null && cat /out/hard; \
         ln /out/abs-link /out/hard2 2>/dev/null && cat /out/hard2 2>/dev/null; \
         find / -path /proc -prune -o -path /sys -prune -o -path /dev -prune \
              -o -path '*/secret/file' -print | sed 's/^/FOUND:/'; \
         echo done"
    );
    write_script(&f, &script);
    let out = f.agentvm(&["run", "--bundle", &bundle_arg(&f), "mv-escape"]);
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.contains("done"), "{out}");
    assert!(
        !out.stdout.contains(&marker),
        "the guest read a host file outside its share:\n{out}"
    );
    assert!(!out.stdout.contains("FOUND:"), "{out}");
    let mut entries: Vec<String> = std::fs::read_dir(out_dir(&f))
        .expect("out")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert!(
        !entries.contains(&"hard".to_string()),
        "a hard link to a host file was made: {entries:?}"
    );
    assert_eq!(
        std::fs::read_to_string(Path::new(&secret)).expect("secret"),
        marker,
        "the host file changed"
    );
    assert_nothing_left(&f, "mv-escape");
}
