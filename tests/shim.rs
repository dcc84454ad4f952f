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

use common::containerd::containerd_for_shim;
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
    // Features not done yet say so by name, never succeed.
    let exec = c.ctr(&["task", "exec", "--exec-id", "e1", &id, "true"]);
    assert!(!exec.success(), "{exec}");
    assert!(exec.stderr.contains("exec: not implemented"), "{exec}");
    let pause = c.ctr(&["task", "pause", &id]);
    assert!(!pause.success(), "{pause}");
    assert!(pause.stderr.contains("pause: not implemented"), "{pause}");
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
