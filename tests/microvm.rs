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

use common::bundle::{assert_nothing_left, assert_one_clear_error, Fixture};
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
            "[microvm]\nkernel = {:?}\nvirtiofsd = {:?}\n{}",
            kernel.display().to_string(),
            common::guest::VIRTIOFSD,
            common::guest::vmm_config_line()
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
    write_script_with_cgroup(f, script, "ro");
}

/// [`write_script`] with the cgroup mount `ro` or `rw`.
fn write_script_with_cgroup(f: &Fixture, script: &str, cgroup: &str) {
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
                "options": ["nosuid", "noexec", "nodev", "relatime", cgroup]
            }),
        ]);
    });
}

fn bundle_arg(f: &Fixture) -> String {
    f.bundle().to_str().expect("utf-8").to_string()
}

/// Waits until `file` exists in the out directory.
#[track_caller]
/// The first non-empty content of `file` in the shared out directory
/// (`echo x > file` in the guest creates it before it writes to it).
fn wait_for_file(f: &Fixture, file: &str) -> String {
    let path = out_dir(f).join(file);
    wait_for(60, || {
        std::fs::read_to_string(&path)
            .ok()
            .filter(|s| !s.is_empty())
    })
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

/// The host pid of this container's QEMU: the supervisor's child.
fn qemu_pid(f: &Fixture, id: &str) -> Option<i32> {
    common::bundle::children_of(pid_of(f, id))
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
        "cat /proc/version /proc/sys/kernel/random/boot_id; echo to-stderr >&2; exit 7",
    );
    // runc's default spec denies every device but the standard ones: the
    // rules are the guest's, and never reach the VMM's host cgroup (on
    // cgroup v2, as in the test host, they would keep /dev/kvm from it).
    f.edit_config(|c| {
        c["linux"]["resources"] =
            serde_json::json!({"devices": [{"allow": false, "access": "rwm"}]});
    });
    let out = f.agentvm(&["run", "--bundle", &bundle_arg(&f), "mv-run"]);
    assert_eq!(out.code, 7, "{out}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_ne!(
        lines[0],
        common::host_kernel_version(),
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
            "cat /proc/version; echo from-exec > /out/exec; cat /out/started",
        ])
        .ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_ne!(
        lines[0],
        common::host_kernel_version(),
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
    // The builtin VMM adds what it counts itself; QEMU counts nothing we
    // read, and the field is absent.
    let vmm = &event["data"]["vmm"];
    if common::guest::builtin() {
        let count = |k: &str| vmm[k].as_u64().unwrap_or(0);
        let first = count("first_instruction_us");
        assert!(first > 0 && first < 60_000_000, "{events}");
        assert!(count("vcpu_exits") > 0, "{events}");
        assert!(count("mmio_exits") > 0, "{events}");
        // The guest's root is the share: every file it read went through
        // the virtio-fs device, and nothing it sent was malformed.
        assert!(count("fs_requests") > 0, "{events}");
        assert_eq!(vmm["bad_chains"], 0, "{events}");
        // The boot's own measure is kept in the state.
        let state =
            std::fs::read_to_string(f.root().join(id).join("microvm.json")).expect("microvm.json");
        let state: serde_json::Value = serde_json::from_str(&state).expect("state JSON");
        assert_eq!(state["first_instruction_us"], first, "{state}");
    } else {
        assert!(vmm.is_null(), "{events}");
    }

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

/// The state root and the bundle sit below a directory that only root's
/// capabilities get through (mode 0600, as `/run/containerd` is when a Go
/// shim made it first). The running supervisor has given those
/// capabilities up, yet `start` runs the spec's startContainer hooks and
/// records "running", exec works, and the workload's exit status is
/// recorded: the supervisor reaches its state through a descriptor, and
/// has its hooks from create.
#[test]
fn a_state_root_below_a_directory_closed_to_the_jailed_supervisor() {
    let f = require!(microvm());
    let id = "mv-closed";
    write_script(
        &f,
        "cat /out/hook > /out/seen; while [ ! -e /out/go ]; do sleep 0.1; done; exit 7",
    );
    f.edit_config(|c| {
        c["hooks"] = serde_json::json!({"startContainer": [
            {"path": "/bin/sh", "args": ["sh", "-c", "echo hooked > /out/hook"]}
        ]});
    });
    use std::os::unix::fs::PermissionsExt;
    let closed = |mode| {
        std::fs::set_permissions(f.dir.path(), std::fs::Permissions::from_mode(mode))
            .expect("chmod");
    };
    closed(0o600);
    f.create(id).ok();
    f.agentvm(&["start", id]).ok();
    assert_eq!(wait_for_file(&f, "seen"), "hooked\n");
    assert_eq!(f.state(id)["status"], "running");
    let out = f.agentvm(&["exec", id, "cat", "/out/seen"]).ok();
    assert_eq!(out.stdout, "hooked\n", "{out}");
    std::fs::write(out_dir(&f).join("go"), "").expect("go");
    wait_for_status(&f, id, "stopped");
    let recorded: serde_json::Value = serde_json::from_slice(
        &std::fs::read(f.root().join(id).join("microvm.json")).expect("microvm.json"),
    )
    .expect("json");
    assert_eq!(recorded["exit_status"], 7, "{recorded}");
    assert!(!log_text(&f).contains("not recorded"), "{}", log_text(&f));
    f.agentvm(&["delete", id]).ok();
    closed(0o700);
    assert_nothing_left(&f, id);
}

#[test]
fn update_gives_the_guest_more_ram_up_to_the_configured_ceiling() {
    let f = require!(microvm());
    // The VM boots with 1 GiB, of which the balloon leaves the guest what
    // its 100 MiB limit needs (limit + 64 MiB of the guest's own).
    let config = f.dir.path().join("config.toml");
    let base = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, format!("{base}memory_ceiling_mib = 1024\n")).expect("write");
    let id = "mvm-ceiling";
    write_script(&f, "echo up > /out/up; exec sleep 1000");
    f.edit_config(|c| {
        c["linux"]["resources"]["memory"] = serde_json::json!({"limit": 100u64 << 20});
    });
    f.create(id).ok();
    f.agentvm(&["start", id]).ok();
    wait_for_file(&f, "up");
    let (_, max) = common::guest::wait_for_guest_ram(&f, id, 164);
    assert_eq!(max, (100u64 << 20).to_string());

    // Raised: the balloon gives the guest its RAM first, then the limit.
    f.agentvm(&["update", "--memory", "600m", id]).ok();
    let (_, max) = common::guest::wait_for_guest_ram(&f, id, 664);
    assert_eq!(max, (600u64 << 20).to_string());
    // Past the VM's RAM: refused, nothing changes.
    let out = f.agentvm(&["update", "--memory", "2g", id]);
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("memory_ceiling_mib"), "{out}");
    // Lowered: the limit first, then the balloon takes the RAM back.
    f.agentvm(&["update", "--memory", "150m", id]).ok();
    let (_, max) = common::guest::wait_for_guest_ram(&f, id, 214);
    assert_eq!(max, (150u64 << 20).to_string());
    // Unlimited: the whole VM.
    f.agentvm(&["update", "--memory", "-1", id]).ok();
    let (_, max) = common::guest::wait_for_guest_ram(&f, id, 1024);
    assert_eq!(max, "max");

    kill_and_delete(&f, id);
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
/// Kills a running container, waits for it to stop, deletes it, and checks
/// that nothing of it is left.
#[track_caller]
fn kill_and_delete(f: &Fixture, id: &str) {
    f.agentvm(&["kill", id, "KILL"]).ok();
    wait_for_status(f, id, "stopped");
    f.agentvm(&["delete", id]).ok();
    assert_nothing_left(f, id);
}

fn start_sleeper(f: &Fixture, id: &str) {
    write_script(f, "echo up > /out/up; exec sleep 1000");
    f.create(id).ok();
    f.agentvm(&["start", id]).ok();
    wait_for_file(f, "up");
}

/// `exec --cgroup` puts the process in a sub-cgroup of the container's,
/// in the guest (where the container's cgroups are), with runc's refusals
/// of a path that leaves the container's cgroup, a controller the guest's
/// cgroup v2 has no hierarchy of, and a sub-cgroup that does not exist.
#[test]
fn exec_cgroup_joins_a_sub_cgroup_in_the_guest() {
    let f = require!(microvm());
    let id = "mv-subcg";
    // The workload makes its sub-cgroup: its cgroup mount is writable.
    write_script_with_cgroup(
        &f,
        "mkdir /sys/fs/cgroup/sub && echo up > /out/up; exec sleep 1000",
        "rw",
    );
    f.create(id).ok();
    f.agentvm(&["start", id]).ok();
    wait_for_file(&f, "up");

    let own = f.agentvm(&["exec", id, "cat", "/proc/self/cgroup"]).ok();
    assert_eq!(own.stdout, "0::/\n", "{own}");
    for sub in ["sub", "/sub"] {
        let out = f
            .agentvm(&["exec", "--cgroup", sub, id, "cat", "/proc/self/cgroup"])
            .ok();
        assert_eq!(out.stdout, "0::/sub\n", "--cgroup {sub}: {out}");
    }
    let procs = f
        .agentvm(&["exec", id, "cat", "/sys/fs/cgroup/sub/cgroup.procs"])
        .ok();
    assert_eq!(procs.stdout, "", "an exec's process outlived it: {procs}");

    for (arg, says) in [
        ("../../escape", "not a sub cgroup path"),
        ("pids:sub", "unknown controller pids"),
        ("nosuch", "nosuch"),
    ] {
        let out = f.agentvm(&["exec", "--cgroup", arg, id, "true"]);
        assert_ne!(out.code, 0, "--cgroup {arg}: {out}");
        assert!(out.stderr.contains(says), "--cgroup {arg}: {out}");
        assert_eq!(
            out.stderr.trim().lines().count(),
            1,
            "--cgroup {arg}: {out}"
        );
    }
    // Refused on the host, as runc refuses it, before the guest is asked.
    let out = f.agentvm(&["exec", "--cgroup", "a", "--cgroup", "b", id, "true"]);
    assert_ne!(out.code, 0, "{out}");
    assert!(out.stderr.contains("invalid --cgroup argument"), "{out}");
    kill_and_delete(&f, id);
}

/// `pause` freezes the workload (a loop in it counts no further) and
/// `resume` lets it go on; the state says so in between, and `ps` and
/// `update` answer meanwhile, as runc's do.
#[test]
fn pause_freezes_the_workload_and_resume_lets_it_go_on() {
    let f = require!(microvm());
    let id = "mv-pause";
    write_script(
        &f,
        "trap 'echo term > /out/term' TERM; \
         i=0; while :; do i=$((i+1)); echo $i > /out/tick.new; mv /out/tick.new /out/tick; sleep 0.1; done",
    );
    f.create(id).ok();
    f.agentvm(&["start", id]).ok();
    let tick = || -> u64 {
        std::fs::read_to_string(out_dir(&f).join("tick"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(
        wait_for(60, || (tick() > 2).then_some(())).is_some(),
        "the loop never ran"
    );
    f.agentvm(&["pause", id]).ok();
    assert_eq!(f.state(id)["status"], "paused");
    // A write under way when the VM froze may still land: read after it.
    std::thread::sleep(Duration::from_millis(500));
    let frozen = tick();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(tick(), frozen, "the workload ran while paused");
    // A paused container cannot be paused again (runc's words), nor
    // deleted.
    assert_one_clear_error(&f, &f.agentvm(&["pause", id]), "container not running");
    // Its processes are listed, and its limits change, frozen.
    let table = f.agentvm(&["ps", id]).ok();
    assert!(table.stdout.contains("sh -c"), "{table}");
    f.agentvm(&["update", "--pids-limit", "77", id]).ok();
    let out = f.agentvm(&["exec", id, "cat", "/sys/fs/cgroup/pids.max"]);
    assert_one_clear_error(&f, &out, "cannot exec in a paused container");
    // exec --ignore-paused waits, as runc's does, until resume, then runs;
    // one whose caller goes away while it waits never runs.
    let ignoring = |file: &str| {
        f.command(&[
            "exec",
            "--ignore-paused",
            id,
            "sh",
            "-c",
            &format!("echo ran > /out/{file}; echo ran"),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("agentvm exec")
    };
    let waiting = ignoring("ignored-pause");
    let mut abandoned = ignoring("abandoned");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !common::process_gone(waiting.id() as i32),
        "exec --ignore-paused returned while the container was paused"
    );
    abandoned.kill().expect("kill the abandoned exec");
    abandoned.wait().expect("reap");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !out_dir(&f).join("ignored-pause").exists(),
        "ran while paused"
    );
    // A signal to a paused container is taken, and stays pending until
    // resume, as for a frozen process under runc.
    f.agentvm(&["kill", id, "TERM"]).ok();
    std::thread::sleep(Duration::from_secs(1));
    assert!(!out_dir(&f).join("term").exists(), "handled while paused");
    f.agentvm(&["resume", id]).ok();
    assert_eq!(f.state(id)["status"], "running");
    let waited = waiting.wait_with_output().expect("exec --ignore-paused");
    assert!(
        waited.status.success() && waited.stdout == b"ran\n",
        "exec --ignore-paused after resume: {waited:?}"
    );
    assert!(
        wait_for(30, || (tick() > frozen + 2).then_some(())).is_some(),
        "the guest did not go on after resume"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !out_dir(&f).join("abandoned").exists(),
        "an exec whose caller went away ran"
    );
    assert!(
        wait_for(30, || out_dir(&f).join("term").exists().then_some(())).is_some(),
        "the TERM sent while paused never arrived"
    );
    let out = f
        .agentvm(&["exec", id, "cat", "/sys/fs/cgroup/pids.max"])
        .ok();
    assert_eq!(out.stdout.trim(), "77", "the update made while paused");
    kill_and_delete(&f, id);
}

/// Under the builtin VMM, its threads run in the supervisor's process:
/// each vCPU, the devices' and the share's event loops and the thread that
/// runs the machine have each entered a seccomp filter and dropped their
/// capabilities (the share's keeps virtiofsd's set), as has the
/// supervisor's main thread once the VM runs.
#[test]
fn the_builtin_vmm_s_threads_are_jailed() {
    let f = require!(microvm());
    if !common::guest::builtin() {
        println!(
            "skipped: the builtin VMM's threads exist only with vmm = \"builtin\", which needs a \
             standard hardware KVM (make test-builtin runs this test in its test host)"
        );
        return;
    }
    let id = "mv-jailed";
    start_sleeper(&f, id);
    let supervisor = pid_of(&f, id);
    // CAP_CHOWN, DAC_OVERRIDE, FOWNER, FSETID, SETGID, SETUID, MKNOD, SETFCAP.
    let fs_caps = [0u32, 1, 3, 4, 6, 7, 27, 31]
        .iter()
        .fold(0u64, |m, c| m | 1 << c);
    let mut seen = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{supervisor}/task")).expect("tasks") {
        let task = task.expect("task").path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let comm = comm.trim().to_string();
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let caps = |name: &str| u64::from_str_radix(&field(name), 16).unwrap_or(u64::MAX);
        let want = match comm.as_str() {
            c if c.starts_with("vcpu") => 0,
            "vmm-devices" => 0,
            "vmm-fs" => fs_caps,
            c if c.starts_with("vmm-") => 0,
            _ => continue,
        };
        assert_eq!(
            field("Seccomp:"),
            "2",
            "{comm}: no seccomp filter\n{status}"
        );
        assert_eq!(field("NoNewPrivs:"), "1", "{comm}\n{status}");
        for set in ["CapEff:", "CapPrm:", "CapBnd:"] {
            assert_eq!(caps(set), want, "{comm} {set}\n{status}");
        }
        seen.push(comm);
    }
    seen.sort();
    assert!(seen.iter().any(|c| c.starts_with("vcpu")), "{seen:?}");
    assert!(seen.iter().any(|c| c == "vmm-devices"), "{seen:?}");
    assert!(seen.iter().any(|c| c == "vmm-fs"), "{seen:?}");
    assert!(
        seen.iter()
            .any(|c| c.starts_with("vmm-") && c != "vmm-devices" && c != "vmm-fs"),
        "the runner: {seen:?}"
    );
    let main = std::fs::read_to_string(format!("/proc/{supervisor}/status")).expect("status");
    assert!(main.contains("Seccomp:\t2"), "the supervisor: {main}");
    // The guest still works through the jailed threads: exec, the share.
    let out = f
        .agentvm(&[
            "exec",
            id,
            "sh",
            "-c",
            "echo through > /out/jailed; cat /out/up",
        ])
        .ok();
    assert_eq!(out.stdout.trim(), "up");
    assert_eq!(wait_for_file(&f, "jailed").trim(), "through");
    kill_and_delete(&f, id);
}

#[test]
fn supervisor_killed_ends_as_stopped_and_delete_cleans_up() {
    let f = require!(microvm());
    let id = "mv-supkill";
    start_sleeper(&f, id);
    // The builtin VMM is the supervisor's own threads; QEMU a child.
    let qemu = (!common::guest::builtin())
        .then(|| qemu_pid(&f, id).expect("a QEMU process for the container"));
    kill(pid_of(&f, id), libc::SIGKILL);
    wait_for_status(&f, id, "stopped");
    // The VMM dies with its supervisor.
    if let Some(qemu) = qemu {
        assert!(
            wait_for(10, || common::process_gone(qemu).then_some(())).is_some(),
            "QEMU {qemu} outlived its supervisor"
        );
    }
    f.agentvm(&["delete", id]).ok();
    assert_nothing_left(&f, id);
}

#[test]
fn vmm_killed_ends_the_container_with_a_log_line() {
    let f = require!(microvm());
    let id = "mv-vmmkill";
    start_sleeper(&f, id);
    let qemu = qemu_pid(&f, id).expect("a QEMU process for the container");
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

/// The value of `field` in a /proc status file (`Uid`, `CapEff`, …).
fn status_field(status: &str, field: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in:\n{status}"))
        .trim()
        .to_string()
}

/// What an escaped QEMU could do, tried for real: a child joins the
/// running QEMU's mount namespace, takes its uid and gid, and tries to
/// read the host's shadow file and a host marker file, to write the jail
/// and the guest's kernel, and to make a device node. Each attempt's
/// errno, in order (0 = it worked).
fn as_an_escaped_qemu(qemu: i32, uid: u32, marker: &Path) -> Vec<i32> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let ns = CString::new(format!("/proc/{qemu}/ns/mnt")).expect("path");
    let marker = CString::new(marker.as_os_str().as_bytes()).expect("path");
    let paths = [c"/etc/shadow", marker.as_c_str()];
    let (pipe_r, pipe_w) = {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) with a valid two-int array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
        (fds[0], fds[1])
    };
    // SAFETY: fork in a test; the child makes only system calls on values
    // built before the fork and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(-1);
        let mut results = [0i32; 6];
        // SAFETY: system calls with NUL-terminated strings that outlive
        // them and plain integers.
        unsafe {
            let fd = libc::open(ns.as_ptr(), libc::O_RDONLY);
            if fd < 0 || libc::setns(fd, libc::CLONE_NEWNS) != 0 {
                libc::_exit(90);
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(uid, uid, uid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                libc::_exit(91);
            }
            for (i, p) in paths.iter().enumerate() {
                let fd = libc::open(p.as_ptr(), libc::O_RDONLY);
                results[i] = if fd >= 0 { 0 } else { errno() };
            }
            let fd = libc::open(c"/planted".as_ptr(), libc::O_WRONLY | libc::O_CREAT, 0o644);
            results[2] = if fd >= 0 { 0 } else { errno() };
            let fd = libc::open(c"/vm/kernel".as_ptr(), libc::O_WRONLY);
            results[3] = if fd >= 0 { 0 } else { errno() };
            let rc = libc::mknod(c"/dev/sda-planted".as_ptr(), libc::S_IFBLK | 0o600, 0x800);
            results[4] = if rc == 0 { 0 } else { errno() };
            let rc = libc::mkdir(c"/proc".as_ptr(), 0o755);
            results[5] = if rc == 0 { 0 } else { errno() };
            libc::write(
                pipe_w,
                results.as_ptr().cast(),
                std::mem::size_of_val(&results),
            );
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(pipe_w) };
    let mut status = 0;
    // SAFETY: waitpid on our own child with a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child could not become QEMU (status {status:#x})"
    );
    let mut results = [0i32; 6];
    // SAFETY: reading into a buffer of exactly that many bytes.
    let n = unsafe {
        libc::read(
            pipe_r,
            results.as_mut_ptr().cast(),
            std::mem::size_of_val(&results),
        )
    };
    // SAFETY: closing the read end we own.
    unsafe { libc::close(pipe_r) };
    assert_eq!(n as usize, std::mem::size_of_val(&results), "short read");
    results.to_vec()
}

/// QEMU parses every device access of the guest, so it is the most exposed
/// process: seen from the host while a VM runs, it has a root of its own
/// without the host's files, an unprivileged uid of its own, no
/// capabilities, no_new_privs and a seccomp filter; a process that joins
/// its view with its identity (an escaped QEMU) reads and changes nothing;
/// and nothing of the jail shows in the host's mounts, then or after.
#[test]
fn qemu_runs_jailed_without_the_hosts_files_or_privileges() {
    let f = require!(microvm());
    let id = "mv-jail";
    // On the host, outside everything the container was given.
    let marker = f
        .dir
        .path()
        .join(format!("jail-marker-{}", std::process::id()));
    std::fs::write(&marker, "host only").expect("marker");
    start_sleeper(&f, id);
    let supervisor = pid_of(&f, id);
    let qemu = qemu_pid(&f, id).expect("a QEMU process for the container");

    // Its identity: base + supervisor pid (the default base), never root.
    let status = std::fs::read_to_string(format!("/proc/{qemu}/status")).expect("status");
    let uid = 2_000_000_000 + supervisor as u32;
    let ids = format!("{uid}\t{uid}\t{uid}\t{uid}");
    assert_eq!(status_field(&status, "Uid"), ids, "{status}");
    assert_eq!(status_field(&status, "Gid"), ids, "{status}");
    assert_eq!(status_field(&status, "Groups"), "", "{status}");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(&status, set), "0000000000000000", "{set}");
    }
    assert_eq!(status_field(&status, "NoNewPrivs"), "1");
    assert_eq!(status_field(&status, "Seccomp"), "2");

    // Its root: a tree of its own, none of the host's files.
    let root = PathBuf::from(format!("/proc/{qemu}/root"));
    let mut top: Vec<String> = std::fs::read_dir(&root)
        .expect("QEMU's root")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    for name in &top {
        assert!(
            ["bin", "dev", "lib", "lib64", "usr", "vm"].contains(&name.as_str()),
            "{name} in QEMU's root: {top:?}"
        );
    }
    let rel = |p: &Path| root.join(p.strip_prefix("/").expect("absolute"));
    for host_path in [
        marker.as_path(),
        Path::new("/etc/shadow"),
        Path::new("/etc/passwd"),
        Path::new("/proc/1"),
        Path::new("/sys/kernel"),
        Path::new("/root"),
        Path::new("/var/run/docker.sock"),
        &f.root().join(id).join("config.json"),
        &out_dir(&f),
    ] {
        assert!(
            !rel(host_path).exists() && std::fs::symlink_metadata(rel(host_path)).is_err(),
            "QEMU sees {}",
            host_path.display()
        );
    }
    let mut devs: Vec<String> = std::fs::read_dir(root.join("dev"))
        .expect("QEMU's /dev")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    devs.sort();
    devs.retain(|d| d != "kvm" && d != "vhost-net");
    assert_eq!(devs, ["null", "urandom", "zero"]);
    // Its own mount, IPC and UTS namespaces, every mount read-only.
    for kind in ["mnt", "ipc", "uts"] {
        let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).expect("ns");
        assert_ne!(ns(&qemu.to_string()), ns("self"), "{kind}");
        assert_ne!(ns(&qemu.to_string()), ns(&supervisor.to_string()), "{kind}");
    }
    let mounts = std::fs::read_to_string(format!("/proc/{qemu}/mountinfo")).expect("mountinfo");
    for line in mounts.lines() {
        let opts = line.split_whitespace().nth(5).unwrap_or_default();
        assert!(
            opts.split(',').any(|o| o == "ro"),
            "a writable mount in QEMU's namespace: {line}"
        );
    }
    // Only descriptors it was given: no host file or directory but its
    // two logs and /dev/null.
    for fd in std::fs::read_dir(format!("/proc/{qemu}/fd")).expect("fds") {
        let target = std::fs::read_link(fd.expect("fd").path()).unwrap_or_default();
        let t = target.to_string_lossy();
        let allowed = !t.starts_with('/')
            || t.starts_with("/memfd:")
            || t == "/dev/null"
            || t == "/dev/net/tun"
            || t.ends_with("/qemu.log")
            || t.ends_with("/console.log");
        assert!(allowed, "QEMU holds {t}");
    }

    // An escaped QEMU: nothing to read, nothing to write, no device.
    let errs = as_an_escaped_qemu(qemu, uid, &marker);
    assert_eq!(errs[0], libc::ENOENT, "/etc/shadow: {errs:?}");
    assert_eq!(errs[1], libc::ENOENT, "the host marker: {errs:?}");
    for (i, what) in [(2, "a new file"), (3, "the guest's kernel"), (5, "a /proc")] {
        assert!(
            errs[i] == libc::EROFS || errs[i] == libc::EACCES,
            "{what}: {errs:?}"
        );
    }
    assert!(
        [libc::EPERM, libc::EROFS, libc::EACCES].contains(&errs[4]),
        "mknod: {errs:?}"
    );

    // The host's namespace never sees the jail.
    let host_mounts = || std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!host_mounts().contains("qemu-root"), "{}", host_mounts());
    kill(supervisor, libc::SIGKILL);
    wait_for_status(&f, id, "stopped");
    f.agentvm(&["delete", id]).ok();
    assert_nothing_left(&f, id);
    assert!(!host_mounts().contains("qemu-root"), "{}", host_mounts());
    assert!(
        !host_mounts().contains(f.root().to_str().expect("utf-8")),
        "{}",
        host_mounts()
    );
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

/// Writes a bundle in `name` (beside the fixture's own) for a further
/// container of the CRI pod whose sandbox is `sandbox` (its supervisor
/// `pause`): CRI's annotations, the sandbox's network, IPC and UTS
/// namespaces by their host paths, and the out directory at /out.
fn write_member(f: &Fixture, name: &str, sandbox: &str, pause: i32, args: &[&str]) -> String {
    let dir = f.dir.path().join(name);
    std::fs::create_dir_all(&dir).expect("member bundle");
    let out = out_dir(f);
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", format!("MEMBER={name}")],
            "cwd": "/"
        },
        "root": {"path": common::rootfs::unpacked(), "readonly": true},
        "annotations": {
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-id": sandbox
        },
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "mode=755"]},
            {"destination": "/out", "type": "bind", "source": out,
             "options": ["rbind", "rw"]}
        ],
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "mount"},
                {"type": "network", "path": format!("/proc/{pause}/ns/net")},
                {"type": "ipc", "path": format!("/proc/{pause}/ns/ipc")},
                {"type": "uts", "path": format!("/proc/{pause}/ns/uts")}
            ]
        }
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(&spec).expect("json"),
    )
    .expect("write member config");
    dir.to_str().expect("utf-8").to_string()
}

/// Mounts of the sandbox's supervisor (its private mount namespace) below
/// its share's `pod/` directory.
fn pod_mounts(pause: i32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pause}/mountinfo"))
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(4)
                .is_some_and(|m| m.contains("/share/pod/"))
        })
        .map(str::to_string)
        .collect()
}

/// A Kubernetes pod is one microVM (issue 11), through agentvm's command
/// line as containerd's shim drives it: the sandbox boots the VM, a
/// further container of the pod runs in it (the same guest kernel, not
/// the host's; the pod's localhost; its own pid namespace; its volume
/// through the sandbox's share), with its own pid (a relay), stdio, exec,
/// signals, exit status and delete; bad members are refused with one
/// clear error; deleting the sandbox stops what is left of the pod.
#[test]
fn a_pod_member_runs_in_its_sandbox_s_vm() {
    let f = require!(microvm());
    // The sandbox serves http on the pod's localhost.
    f.write_config(
        &[
            "sh",
            "-c",
            "mkdir -p /dev/w && echo hello-pod > /dev/w/index.html && exec httpd -f -p 8080 -h /dev/w",
        ],
        |c| {
            c["annotations"] = serde_json::json!({
                "io.kubernetes.cri.container-type": "sandbox",
                "io.kubernetes.cri.sandbox-id": "pod-sb"
            });
        },
    );
    f.create("pod-sb").ok();
    f.agentvm(&["start", "pod-sb"]).ok();
    let pause = pid_of(&f, "pod-sb");

    // Refused with one clear error, nothing left: an unknown sandbox, and
    // a namespace that is not the sandbox's (the host's own).
    let bad = write_member(&f, "bad", "no-such-pod", pause, &["true"]);
    let out = f.agentvm(&["create", "--bundle", &bad, "bad"]);
    assert_one_clear_error(&f, &out, "pod sandbox no-such-pod does not exist");
    let host_ns = write_member(&f, "hostns", "pod-sb", 1, &["true"]);
    let out = f.agentvm(&["create", "--bundle", &host_ns, "hostns"]);
    assert_one_clear_error(&f, &out, "not the namespace of pod sandbox pod-sb");
    assert_eq!(f.leftovers(), vec!["pod-sb".to_string()]);

    let member = write_member(
        &f,
        "app",
        "pod-sb",
        pause,
        &[
            "sh",
            "-c",
            "cat /proc/version > /out/version; echo to-stdout; echo to-stderr >&2; \
             read line; echo \"got $line\" > /out/stdin; sleep 1000",
        ],
    );
    let pid_file = f.dir.path().join("app.pid");
    let mut cmd = f.command(&[
        "create",
        "--bundle",
        &member,
        "--pid-file",
        pid_file.to_str().expect("utf-8"),
        "app",
    ]);
    let stdout = f.dir.path().join("app.stdout");
    let stderr = f.dir.path().join("app.stderr");
    let (stdin_read, mut stdin_write) = std::io::pipe().expect("pipe");
    cmd.stdin(stdin_read)
        .stdout(std::fs::File::create(&stdout).expect("stdout"))
        .stderr(std::fs::File::create(&stderr).expect("stderr"));
    let status = cmd.status().expect("agentvm create");
    assert!(
        status.success(),
        "create app: {}",
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
    let state = f.state("app");
    assert_eq!(state["status"], "created", "{state}");
    let relay = pid_of(&f, "app");
    assert_eq!(
        std::fs::read_to_string(&pid_file).expect("pid file").trim(),
        relay.to_string()
    );
    assert_ne!(relay, pause, "the member has a pid of its own");
    f.agentvm(&["start", "app"]).ok();
    assert_eq!(f.state("app")["status"], "running");
    use std::io::Write;
    stdin_write.write_all(b"a line\n").expect("write stdin");
    drop(stdin_write);

    // One guest kernel for the pod, not the host's.
    let version = wait_for_file(&f, "version");
    let host_version = std::fs::read_to_string("/proc/version").expect("/proc/version");
    assert_ne!(
        version, host_version,
        "the member runs on the host's kernel"
    );
    let sandbox_version = f.agentvm(&["exec", "pod-sb", "cat", "/proc/version"]).ok();
    assert_eq!(sandbox_version.stdout, version, "two kernels in one pod");
    assert_eq!(wait_for_file(&f, "stdin"), "got a line\n");
    let printed = wait_for(30, || {
        let out = std::fs::read_to_string(&stdout).unwrap_or_default();
        let err = std::fs::read_to_string(&stderr).unwrap_or_default();
        (out == "to-stdout\n" && err == "to-stderr\n").then_some(())
    });
    assert!(
        printed.is_some(),
        "the member's stdio: {:?} / {:?}",
        std::fs::read_to_string(&stdout),
        std::fs::read_to_string(&stderr)
    );

    // exec lands in the member: its own pid namespace and environment,
    // the pod's localhost.
    // (sh runs its last command in its own place.)
    let out = f.agentvm(&["exec", "app", "cat", "/proc/1/cmdline"]).ok();
    assert_eq!(out.stdout, "sleep\u{0}1000\u{0}", "{out}");
    let out = f.agentvm(&["exec", "app", "sh", "-c", "echo $MEMBER"]).ok();
    assert_eq!(out.stdout, "app\n");
    let out = f
        .agentvm(&["exec", "app", "wget", "-q", "-O-", "http://127.0.0.1:8080/"])
        .ok();
    assert_eq!(out.stdout, "hello-pod\n", "the pod's localhost");
    let out = f.agentvm(&["exec", "app", "sh", "-c", "exit 5"]);
    assert_eq!(out.code, 5, "{out}");
    let ps = f.agentvm(&["ps", "--format", "json", "app"]).ok();
    assert_eq!(ps.stdout.trim(), format!("[{relay}]"));
    let table = f.agentvm(&["ps", "app"]).ok();
    assert!(table.stdout.contains("sleep 1000"), "{table}");
    assert!(!table.stdout.contains("httpd"), "the sandbox's: {table}");
    // One container of the pod pauses alone: its cgroup in the guest is
    // frozen, the sandbox's server goes on answering.
    f.agentvm(&["pause", "app"]).ok();
    assert_eq!(f.state("app")["status"], "paused");
    let table = f.agentvm(&["ps", "app"]).ok();
    assert!(
        table.stdout.contains("sleep 1000"),
        "frozen, listed: {table}"
    );
    let out = f
        .agentvm(&[
            "exec",
            "pod-sb",
            "wget",
            "-q",
            "-O-",
            "http://127.0.0.1:8080/",
        ])
        .ok();
    assert_eq!(out.stdout, "hello-pod\n", "the sandbox runs on");
    f.agentvm(&["resume", "app"]).ok();
    assert_eq!(f.state("app")["status"], "running");
    assert_eq!(
        pod_mounts(pause).len(),
        2,
        "rootfs and /out: {:?}",
        pod_mounts(pause)
    );

    // A signal reaches the member's processes; its status is the relay's.
    f.agentvm(&["kill", "app", "KILL"]).ok();
    wait_for_status(&f, "app", "stopped");
    let recorded: serde_json::Value = serde_json::from_slice(
        &std::fs::read(f.root().join("app/microvm.json")).expect("microvm.json"),
    )
    .expect("json");
    assert_eq!(recorded["exit_status"], 137, "{recorded}");
    f.agentvm(&["delete", "app"]).ok();
    assert!(pod_mounts(pause).is_empty(), "{:?}", pod_mounts(pause));
    // The sandbox is untouched.
    let out = f.agentvm(&["exec", "pod-sb", "echo", "still-here"]).ok();
    assert_eq!(out.stdout, "still-here\n");
    assert_eq!(processes_with_id(&f, "app"), Vec::<String>::new());

    // Deleting the sandbox ends the VM: a member still running stops (as
    // a VM that went away: 255) and is deleted as any stopped container.
    let last = write_member(&f, "last", "pod-sb", pause, &["sleep", "1000"]);
    f.agentvm(&["create", "--bundle", &last, "last"]).ok();
    f.agentvm(&["start", "last"]).ok();
    f.agentvm(&["delete", "--force", "pod-sb"]).ok();
    wait_for_status(&f, "last", "stopped");
    f.agentvm(&["delete", "last"]).ok();
    assert_nothing_left(&f, "pod-sb");
    assert_eq!(processes_with_id(&f, "last"), Vec::<String>::new());
}

/// Processes whose command line names `id` in this fixture's state root.
fn processes_with_id(f: &Fixture, id: &str) -> Vec<String> {
    common::bundle::processes_with(&format!("{} ", f.root().display()))
        .into_iter()
        .filter(|p| p.contains(&format!(" {id}")))
        .collect()
}

/// Receives the pty master a runtime sends to the console socket `listener`.
fn receive_master(listener: &std::os::unix::net::UnixListener) -> std::fs::File {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::{AsRawFd, FromRawFd};
    let (conn, _) = listener.accept().expect("accept on the console socket");
    let mut buf = [0u8; 256];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )
    .expect("recvmsg");
    for c in msg.cmsgs().expect("cmsgs") {
        if let ControlMessageOwned::ScmRights(fds) = c {
            // SAFETY: the descriptor just arrived by SCM_RIGHTS: ours alone.
            return unsafe { std::fs::File::from_raw_fd(fds[0]) };
        }
    }
    panic!("no descriptor on the console socket");
}

/// Everything read from the pty `master` from now on, as it arrives.
fn collect_output(master: &std::fs::File) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::Read;
    let mut reader = master.try_clone().expect("clone master");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = seen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .expect("output lock")
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    seen
}

/// Sets the window size of the pty `master`.
fn resize(master: &std::fs::File, rows: u16, cols: u16) {
    use std::os::fd::AsRawFd;
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ on a pty master we own, with a valid winsize.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    assert_eq!(rc, 0, "resize the pty");
}

/// Types `line` into the terminal until its output holds every one of
/// `want` (the shell may not be reading yet), or 60 s have passed.
fn type_until(
    master: &mut std::fs::File,
    seen: &std::sync::Mutex<String>,
    line: &[u8],
    want: &[&str],
) {
    use std::io::Write;
    let found = wait_for(60, || {
        master.write_all(line).ok()?;
        std::thread::sleep(Duration::from_millis(500));
        let text = seen.lock().expect("output lock").clone();
        want.iter().all(|w| text.contains(w)).then_some(())
    });
    assert!(
        found.is_some(),
        "the terminal's output, waiting for {want:?}: {:?}",
        seen.lock().expect("output lock")
    );
}

/// `docker run -it` in a microVM: the init's terminal is a pty in the
/// guest whose master reaches the console socket; input, a resize and
/// the exit status go through it; `exec -t` gets a terminal of its own.
#[test]
fn a_terminal_in_the_guest() {
    use std::io::Write;
    let f = require!(microvm());
    let id = "mv-tty";
    f.write_config(&["sh"], |c| {
        c["process"]["terminal"] = true.into();
        c["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(serde_json::json!({
                "destination": "/dev/pts", "type": "devpts", "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]
            }));
    });
    let sock = f.dir.path().join("console.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("console socket");
    let receiver = std::thread::spawn(move || receive_master(&listener));
    f.agentvm(&[
        "create",
        "--bundle",
        &bundle_arg(&f),
        "--console-socket",
        sock.to_str().expect("utf-8"),
        id,
    ])
    .ok();
    let mut master = receiver.join().expect("the pty master");
    f.agentvm(&["start", id]).ok();
    resize(&master, 33, 97);
    let seen = collect_output(&master);
    type_until(
        &mut master,
        &seen,
        b"stty size; tty; cat /proc/version; echo sum-$((40+2))\n",
        &["33 97", "/dev/pts/", "sum-42"],
    );
    assert!(
        !seen
            .lock()
            .unwrap()
            .contains(&common::host_kernel_version()),
        "the terminal's shell runs on the host's kernel: {:?}",
        seen.lock().unwrap()
    );

    // exec -t: a second pty, from a second console socket.
    let exec_sock = f.dir.path().join("exec-console.sock");
    let listener = std::os::unix::net::UnixListener::bind(&exec_sock).expect("console socket");
    let receiver = std::thread::spawn(move || receive_master(&listener));
    let exec = f
        .command(&[
            "exec",
            "--tty",
            "--console-socket",
            exec_sock.to_str().expect("utf-8"),
            id,
            "sh",
        ])
        .spawn()
        .expect("start exec -t");
    let mut exec_master = receiver.join().expect("the exec's pty master");
    resize(&exec_master, 21, 61);
    let exec_seen = collect_output(&exec_master);
    type_until(
        &mut exec_master,
        &exec_seen,
        b"stty size; echo exec-$((6*7))\n",
        &["21 61", "exec-42"],
    );
    exec_master.write_all(b"exit 4\n").expect("exit the exec");
    let status = exec.wait_with_output().expect("exec ends");
    assert_eq!(status.status.code(), Some(4), "exec -t's exit status");

    master.write_all(b"exit 6\n").expect("exit");
    wait_for_status(&f, id, "stopped");
    let recorded: serde_json::Value = serde_json::from_slice(
        &std::fs::read(f.root().join(format!("{id}/microvm.json"))).expect("microvm.json"),
    )
    .expect("json");
    assert_eq!(recorded["exit_status"], 6, "{recorded}");
    f.agentvm(&["delete", id]).ok();
    assert_nothing_left(&f, id);
}

/// A pod member with a terminal (`kubectl run -it`): its pty master goes
/// to the console socket at create, input and a resize reach the shell in
/// the guest, and its exit status is the relay's.
#[test]
fn a_pod_member_with_a_terminal() {
    use std::io::Write;
    let f = require!(microvm());
    f.write_config(&["sleep", "1000"], |c| {
        c["annotations"] = serde_json::json!({
            "io.kubernetes.cri.container-type": "sandbox",
            "io.kubernetes.cri.sandbox-id": "tty-sb"
        });
    });
    f.create("tty-sb").ok();
    f.agentvm(&["start", "tty-sb"]).ok();
    let pause = pid_of(&f, "tty-sb");
    let member = write_member(&f, "tty", "tty-sb", pause, &["sh"]);
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{member}/config.json")).unwrap()).unwrap();
    spec["process"]["terminal"] = true.into();
    spec["mounts"]
        .as_array_mut()
        .expect("mounts")
        .push(serde_json::json!({
            "destination": "/dev/pts", "type": "devpts", "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]
        }));
    std::fs::write(
        format!("{member}/config.json"),
        serde_json::to_vec(&spec).unwrap(),
    )
    .unwrap();
    let sock = f.dir.path().join("console.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("console socket");
    let receiver = std::thread::spawn(move || receive_master(&listener));
    f.agentvm(&[
        "create",
        "--bundle",
        &member,
        "--console-socket",
        sock.to_str().expect("utf-8"),
        "tty",
    ])
    .ok();
    let mut master = receiver.join().expect("the pty master");
    f.agentvm(&["start", "tty"]).ok();
    resize(&master, 41, 101);
    let seen = collect_output(&master);
    type_until(
        &mut master,
        &seen,
        b"stty size; echo sum-$((20+22))\n",
        &["41 101", "sum-42"],
    );
    master.write_all(b"exit 3\n").expect("exit");
    wait_for_status(&f, "tty", "stopped");
    let recorded: serde_json::Value = serde_json::from_slice(
        &std::fs::read(f.root().join("tty/microvm.json")).expect("microvm.json"),
    )
    .expect("json");
    assert_eq!(recorded["exit_status"], 3, "{recorded}");
    f.agentvm(&["delete", "tty"]).ok();
    f.agentvm(&["delete", "--force", "tty-sb"]).ok();
    assert_nothing_left(&f, "tty-sb");
}
