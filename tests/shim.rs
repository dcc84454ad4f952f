//! containerd's shim v2 for agentvm (`containerd-shim-agentvm-v2`, shim/)
//! end to end: a dedicated containerd whose `PATH` finds the shim of this
//! build, driven by `ctr run --runtime io.containerd.agentvm.v2` on the
//! unpacked busybox rootfs, the tier chosen by the OCI annotation
//! `io.agentvm.isolation` (see tests/support/src/containerd.rs).
//!
//!     cargo build --release -p agentvm-shim
//!     cargo test --release --test shim -- --nocapture

use agentvm_test_support as common;
use common::require;

use common::containerd::{containerd_for_shim, Containerd, SHIM_RUNTIME};
use common::pty::PtySession;
use common::{host_boot_id, unique_name};

#[test]
fn shim_container_tier_runs_and_prints() {
    let c = require!(containerd_for_shim());
    let out = c
        .run_rm_shim(
            &unique_name("shim-echo"),
            "container",
            &["echo", "hello from the agentvm shim"],
        )
        .ok();
    assert_eq!(out.stdout, "hello from the agentvm shim\n");
}

#[test]
fn shim_container_tier_reports_the_exit_status() {
    let c = require!(containerd_for_shim());
    c.run_rm_shim(
        &unique_name("shim-exit"),
        "container",
        &["sh", "-c", "exit 42"],
    )
    .code(42);
    c.run_rm_shim(&unique_name("shim-true"), "container", &["true"])
        .code(0);
}

#[test]
fn shim_container_tier_shares_the_host_kernel_and_writes_stderr() {
    let c = require!(containerd_for_shim());
    let out = c
        .run_rm_shim(
            &unique_name("shim-kernel"),
            "container",
            &[
                "sh",
                "-c",
                "cat /proc/sys/kernel/random/boot_id; echo to-stderr >&2",
            ],
        )
        .ok();
    assert_eq!(out.out(), host_boot_id(), "{out}");
    assert_eq!(out.stderr, "to-stderr\n", "{out}");
}

/// The status column of `ctr task ls` for `id`.
fn task_status(c: &common::containerd::Containerd, id: &str) -> String {
    let out = c.ctr(&["task", "ls"]).ok();
    out.stdout
        .lines()
        .find_map(|line| {
            let mut cols = line.split_whitespace();
            (cols.next() == Some(id)).then(|| cols.nth(1).unwrap_or_default().to_string())
        })
        .unwrap_or_default()
}

#[test]
fn shim_container_tier_detached_kill_and_unimplemented_features() {
    let c = require!(containerd_for_shim());
    let id = unique_name("shim-kill");
    c.run_detached_shim(&id, "container", &["sleep", "300"])
        .ok();
    assert_eq!(task_status(c, &id), "RUNNING");
    // `pids`: the init's host pid, as `ctr task ls` shows it.
    let ps = c.ctr(&["task", "ps", &id]).ok();
    assert_eq!(ps.stdout.lines().count(), 2, "{ps}");
    // What is not done says so by name, never succeeds.
    let checkpoint = c.ctr(&["task", "checkpoint", &id]);
    assert!(!checkpoint.success(), "{checkpoint}");
    assert!(
        checkpoint.stderr.contains("checkpoint: not implemented"),
        "{checkpoint}"
    );
    assert_eq!(task_status(c, &id), "RUNNING");
    // SIGKILL (sleep is pid 1 of its namespace: SIGTERM is ignored).
    c.ctr(&["task", "kill", "-s", "SIGKILL", &id]).ok();
    assert!(
        common::wait_for(30, || (task_status(c, &id) == "STOPPED").then_some(())).is_some(),
        "{id} did not stop after SIGKILL"
    );
    c.ctr(&["task", "delete", &id]).ok();
    c.ctr(&["container", "rm", &id]).ok();
    assert_eq!(task_status(c, &id), "");
}

#[test]
fn shim_container_tier_runs_an_image_from_the_snapshotter() {
    let c = require!(containerd_for_shim());
    let out = c
        .run_rm_shim_image(
            &unique_name("shim-image"),
            "container",
            &["sh", "-c", "echo from the image; exit 3"],
        )
        .code(3);
    assert_eq!(out.stdout, "from the image\n", "{out}");
}

#[test]
fn shim_container_tier_relays_stdin_until_end_of_file() {
    let c = require!(containerd_for_shim());
    let out = c
        .run_rm_shim_image_input(
            &unique_name("shim-stdin"),
            "container",
            Some(b"line one\nline two\n"),
            &["sh", "-c", "wc -l; echo after end of file"],
        )
        .ok();
    assert_eq!(
        out.stdout.split_whitespace().collect::<Vec<_>>(),
        ["2", "after", "end", "of", "file"],
        "{out}"
    );
}

/// The microvm tier through the shim: `agentvm create` leaves the VM's
/// supervisor as the task's pid, which the shim treats as any init.
#[test]
fn shim_microvm_tier_runs_in_its_own_kernel() {
    if let Some(why) = common::guest::unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let c = require!(containerd_for_shim());
    let out = c
        .run_rm_shim_image(
            &unique_name("shim-vm"),
            "microvm",
            &[
                "sh",
                "-c",
                "uname -r; cat /proc/sys/kernel/random/boot_id; exit 7",
            ],
        )
        .code(7);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_ne!(
        lines[0],
        common::host_uname_r(),
        "the host's kernel answered"
    );
    assert_ne!(lines[1], host_boot_id(), "the host's boot id");
}

// Phase 2: exec, terminals, pause/resume, metrics, update and OOM events,
// each in both tiers (`<test>::container`, `<test>::microvm`).

/// Generates `mod $name { container, microvm }` running `$body(tier)`.
macro_rules! both_tiers {
    ($name:ident, $body:ident) => {
        mod $name {
            #[test]
            fn container() {
                super::$body("container");
            }
            #[test]
            fn microvm() {
                super::$body("microvm");
            }
        }
    };
}

/// The shim's containerd, when `tier` can run here.
fn fixture(tier: &str) -> Result<&'static Containerd, String> {
    if tier == "microvm" {
        if let Some(why) = common::guest::unavailable() {
            return Err(why);
        }
    }
    containerd_for_shim()
}

/// A task started with `ctr run -d` on the image; killed and removed when
/// dropped.
struct Task {
    c: &'static Containerd,
    id: String,
}

impl Task {
    fn start(
        c: &'static Containerd,
        test: &str,
        tier: &str,
        options: &[&str],
        command: &[&str],
    ) -> Task {
        let task = Task {
            c,
            id: unique_name(test),
        };
        c.run_shim_image_with("-d", &task.id, tier, options, command)
            .ok();
        assert_eq!(task_status(c, &task.id), "RUNNING");
        task
    }

    /// `ctr task exec --exec-id EXEC_ID <id> COMMAND`.
    fn exec(&self, exec_id: &str, command: &[&str]) -> common::cmd::Output {
        let mut args = vec!["task", "exec", "--exec-id", exec_id, self.id.as_str()];
        args.extend_from_slice(command);
        self.c.ctr(&args)
    }

    /// `ctr task metrics --format json`, as JSON.
    fn metrics(&self) -> serde_json::Value {
        let out = self
            .c
            .ctr(&["task", "metrics", "--format", "json", &self.id])
            .ok();
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        let _ = self.c.ctr(&["task", "kill", "-s", "SIGKILL", &self.id]);
        common::wait_for(30, || {
            matches!(task_status(self.c, &self.id).as_str(), "STOPPED" | "").then_some(())
        });
        let _ = self.c.ctr(&["task", "delete", "--force", &self.id]);
        let _ = self.c.ctr(&["container", "rm", &self.id]);
    }
}

/// The figures `ctr task metrics --format json` shows, whichever type the
/// shim sent (cgroup v1 on a v1 or hybrid host, v2 on a unified one):
/// (memory usage, memory limit, CPU usage, pids).
fn metric_figures(m: &serde_json::Value) -> (u64, u64, u64, u64) {
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let memory = &m["memory"];
    if memory["usage"].is_object() {
        (
            n(&memory["usage"]["usage"]),
            n(&memory["usage"]["limit"]),
            n(&m["cpu"]["usage"]["total"]),
            n(&m["pids"]["current"]),
        )
    } else {
        (
            n(&memory["usage"]),
            n(&memory["usage_limit"]),
            n(&m["cpu"]["usage_usec"]),
            n(&m["pids"]["current"]),
        )
    }
}

/// The boot id the task's processes see, and whether it must be the
/// host's (container tier) or not (microvm tier).
fn check_kernel(tier: &str, boot_id: &str) {
    if tier == "microvm" {
        assert_ne!(
            boot_id,
            host_boot_id(),
            "an exec of the microvm tier ran on the host"
        );
    } else {
        assert_eq!(boot_id, host_boot_id());
    }
}

fn exec_exit_status_and_output(tier: &str) {
    let c = require!(fixture(tier));
    let t = Task::start(c, "shim-exec", tier, &[], &["sleep", "300"]);
    t.exec("seven", &["sh", "-c", "exit 7"]).code(7);
    let out = t
        .exec(
            "out",
            &[
                "sh",
                "-c",
                "echo to-stdout; echo to-stderr >&2; cat /proc/sys/kernel/random/boot_id",
            ],
        )
        .ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0], "to-stdout", "{out}");
    check_kernel(tier, lines[1]);
    assert_eq!(out.stderr, "to-stderr\n", "{out}");
    // ctr deleted the exec once it ended: its id can be used again.
    t.exec("seven", &["true"]).ok();
    assert_eq!(task_status(c, &t.id), "RUNNING");
}
both_tiers!(
    shim_exec_exit_status_and_output,
    exec_exit_status_and_output
);

/// Waits for the terminal to be 24x80 and says so, then for 40x100, then
/// exits with `code`: a resize that does not arrive fails the test by
/// timeout.
fn terminal_script(code: u8) -> String {
    format!(
        "until [ \"$(stty size)\" = '24 80' ]; do sleep 0.1; done; echo size $(stty size); \
         until [ \"$(stty size)\" = '40 100' ]; do sleep 0.1; done; echo size $(stty size); \
         tty; exit {code}"
    )
}

fn resized_terminal(mut session: PtySession, code: i32) {
    session.expect("size 24 80", 60);
    session.resize(40, 100);
    session.expect("size 40 100", 60);
    session.expect("/dev/pts/", 30);
    assert_eq!(session.wait(60), code, "{}", session.output());
}

fn exec_terminal_resize(tier: &str) {
    let c = require!(fixture(tier));
    let t = Task::start(c, "shim-exec-tty", tier, &[], &["sleep", "300"]);
    let mut ctr = c.ctr_command();
    ctr.args(["task", "exec", "-t", "--exec-id", "tty", &t.id, "sh", "-c"])
        .arg(terminal_script(3));
    resized_terminal(PtySession::spawn(ctr, 24, 80), 3);
}
both_tiers!(shim_exec_terminal_resize, exec_terminal_resize);

/// `ctr run -t`: the init's terminal through the console socket at create.
fn init_terminal_resize(tier: &str) {
    let c = require!(fixture(tier));
    // Removed by `--rm`; by this guard if the test fails first.
    let task = Task {
        c,
        id: unique_name("shim-init-tty"),
    };
    let mut ctr = c.ctr_command();
    ctr.args(["run", "-t", "--rm", "--runtime", SHIM_RUNTIME])
        .arg("--annotation")
        .arg(format!("{}={tier}", common::ISOLATION_ANNOTATION))
        .arg(c.busybox_image())
        .arg(&task.id)
        .args(["sh", "-c"])
        .arg(terminal_script(4));
    resized_terminal(PtySession::spawn(ctr, 24, 80), 4);
}
both_tiers!(shim_init_terminal_resize, init_terminal_resize);

fn pause_and_resume(tier: &str) {
    let c = require!(fixture(tier));
    let t = Task::start(
        c,
        "shim-pause",
        tier,
        &[],
        &[
            "sh",
            "-c",
            "i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done",
        ],
    );
    // The snapshot is the bundle's rootfs on the host (in the microvm
    // tier, shared into the guest): the counter is read from here.
    let counter = c.task_bundle(&t.id).join("rootfs/tmp/counter");
    let read = || -> Option<u64> { std::fs::read_to_string(&counter).ok()?.trim().parse().ok() };
    let advances =
        |from: u64, secs: u64| common::wait_for(secs, || read().filter(|n| *n > from)).is_some();
    let first = common::wait_for(60, read).expect("the counter never started");
    assert!(advances(first, 30), "the running counter did not advance");
    c.ctr(&["task", "pause", &t.id]).ok();
    assert_eq!(task_status(c, &t.id), "PAUSED");
    let paused = read();
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(read(), paused, "the counter advanced while paused");
    c.ctr(&["task", "resume", &t.id]).ok();
    assert_eq!(task_status(c, &t.id), "RUNNING");
    assert!(
        advances(paused.unwrap_or(0), 30),
        "the counter did not advance after resume"
    );
}
both_tiers!(shim_pause_and_resume, pause_and_resume);

fn metrics_from_the_tier(tier: &str) {
    let c = require!(fixture(tier));
    let t = Task::start(
        c,
        "shim-metrics",
        tier,
        &[],
        &["sh", "-c", "sleep 1000 & sleep 1000 & wait"],
    );
    // sh and its two sleeps, once both have started.
    let metrics = common::wait_for(60, || {
        let m = t.metrics();
        (metric_figures(&m).3 == 3).then_some(m)
    })
    .unwrap_or_else(|| panic!("pids.current never reached 3: {}", t.metrics()));
    let (memory, limit, cpu, _) = metric_figures(&metrics);
    assert!(memory > 0, "memory usage is 0: {metrics}");
    assert!(cpu > 0, "CPU usage is 0: {metrics}");
    if tier == "microvm" {
        // The guest's figures: with no limit the container's memory is
        // bounded by the guest's RAM, which the guest's /proc/meminfo
        // shows (and its three processes, not the VMM's threads).
        let meminfo = t.exec("meminfo", &["head", "-n1", "/proc/meminfo"]).ok();
        let kib: u64 = meminfo
            .stdout
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no MemTotal: {meminfo}"));
        assert_eq!(limit, kib * 1024, "{metrics}");
    } else {
        assert!(limit > 0, "{metrics}");
    }
}
both_tiers!(shim_metrics_from_the_tier, metrics_from_the_tier);

/// dd's buffer is allocated and filled: 48 MiB of memory.
const ALLOCATE_48M: [&str; 5] = ["dd", "if=/dev/zero", "of=/dev/null", "bs=48M", "count=1"];

fn update_memory_limit(tier: &str) {
    let c = require!(fixture(tier));
    let t = Task::start(c, "shim-update", tier, &[], &["sleep", "300"]);
    t.exec("before", &ALLOCATE_48M).ok();
    let limit: u64 = 32 << 20;
    c.shim_update(&t.id, &serde_json::json!({"memory": {"limit": limit}}))
        .unwrap_or_else(|e| panic!("{e}"));
    // The limit holds inside: the same allocation is now killed.
    t.exec("after", &ALLOCATE_48M).code(137);
    assert_eq!(metric_figures(&t.metrics()).1, limit);
    assert_eq!(task_status(c, &t.id), "RUNNING");
}
both_tiers!(shim_update_memory_limit, update_memory_limit);

fn oom_event(tier: &str) {
    let c = require!(fixture(tier));
    let id = unique_name("shim-oom");
    let mut events = c.ctr_command();
    events
        .arg("events")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut events = events.spawn().expect("ctr events");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let stdout = events.stdout.take().expect("ctr events' stdout");
    let sink = std::sync::Arc::clone(&seen);
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            sink.lock().expect("events lock").push_str(&(line + "\n"));
        }
    });
    // ctr subscribes before it prints anything: wait for its first event.
    c.ctr(&[
        "container",
        "create",
        c.busybox_image(),
        &format!("{id}-probe"),
    ])
    .ok();
    c.ctr(&["container", "rm", &format!("{id}-probe")]).ok();
    common::wait_for(30, || {
        seen.lock()
            .expect("events lock")
            .contains("/containers/")
            .then_some(())
    })
    .expect("ctr events printed nothing");
    c.run_shim_image_with(
        "--rm",
        &id,
        tier,
        &["--memory-limit", "33554432"],
        &[
            "sh",
            "-c",
            "dd if=/dev/zero of=/dev/null bs=64M count=1; echo dd $?",
        ],
    )
    .ok();
    let oom = common::wait_for(30, || {
        let text = seen.lock().expect("events lock").clone();
        text.lines()
            .any(|l| l.contains("/tasks/oom") && l.contains(&format!("\"{id}\"")))
            .then_some(())
    });
    let _ = events.kill();
    let _ = events.wait();
    assert!(
        oom.is_some(),
        "no /tasks/oom for {id}; events:\n{}",
        seen.lock().expect("events lock")
    );
}
both_tiers!(shim_oom_event, oom_event);
