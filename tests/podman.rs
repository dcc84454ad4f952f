//! Podman end to end: `podman --runtime <agentvm> --runtime-flag
//! isolation=container run ...` with isolated storage and config (see
//! tests/support/src/podman.rs). `AGENTVM_TEST_RUNTIME=runc` runs the same checks
//! with runc.
//!
//!     cargo test --test podman -- --nocapture

use agentvm_test_support as common;
use common::require;

use common::podman::{podman, IMAGE};
use common::{cmd, expects_host_kernel, host_boot_id, ISOLATION_ANNOTATION};

#[test]
fn podman_run_rm_echo() {
    let p = require!(podman());
    let out = p.run_rm(&["echo", "hello from podman"]).ok();
    assert_eq!(out.stdout, "hello from podman\n");
}

#[test]
fn podman_exit_code_is_propagated() {
    let p = require!(podman());
    p.run_rm(&["sh", "-c", "exit 42"]).code(42);
    p.run_rm(&["true"]).code(0);
}

#[test]
fn podman_runtime_flag_picks_the_tier() {
    let p = require!(podman());
    let boot_id = p.run_rm(&["cat", "/proc/sys/kernel/random/boot_id"]).ok();
    let same = boot_id.out() == host_boot_id();
    assert_eq!(same, expects_host_kernel(&p.runtime), "{boot_id}");
}

#[test]
fn podman_annotation_picks_the_container_tier() {
    let p = require!(podman());
    // No --runtime-flag: the per-container annotation alone asks for the
    // container tier (a peer runtime ignores it).
    let annotation = format!("{ISOLATION_ANNOTATION}=container");
    let mut c = p.cmd_with_flag(false);
    c.args([
        "run",
        "--rm",
        "--network",
        "none",
        "--annotation",
        &annotation,
        IMAGE,
    ])
    .args(["cat", "/proc/sys/kernel/random/boot_id"]);
    let out = cmd::run(&mut c).ok();
    assert_eq!(out.out(), host_boot_id(), "not the container tier:\n{out}");
}

/// `podman container checkpoint` and `restore` through the runtime (Podman
/// drives its `checkpoint` and, through conmon, its `restore`): the
/// workload, a counter kept in its shell's memory and printed to its log,
/// goes on from where it was rather than from 1.
#[test]
fn podman_checkpoint_and_restore_go_on_where_the_workload_was() {
    let p = require!(podman());
    if let Err(why) = common::criu_works() {
        println!("skipped: {why}");
        return;
    }
    if p.runtime == common::Runtime::AgentvmDefault {
        println!("skipped: the microvm tier has no checkpoint yet (a VM snapshot)");
        return;
    }
    let name = common::unique_name("podman-cr");
    let counting = "i=0; while :; do i=$((i+1)); echo $i; sleep 0.05; done";
    let mut c = p.cmd();
    c.args(["run", "-d", "--name", &name, "--network", "none", IMAGE])
        .args(["sh", "-c", counting]);
    cmd::run(&mut c).ok();
    let numbers = || -> Vec<u64> {
        let out = cmd::run(p.cmd().args(["logs", &name]));
        out.stdout
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let counted = common::wait_for(20, || (numbers().len() >= 10).then_some(()));
    let checkpoint = cmd::run(p.cmd().args(["container", "checkpoint", &name]));
    let before = numbers();
    let restore = cmd::run(p.cmd().args(["container", "restore", &name]));
    let after = common::wait_for(20, || {
        let n = numbers();
        (n.len() >= before.len() + 5).then_some(n)
    });
    cmd::run(p.cmd().args(["rm", "-f", &name]));
    assert!(counted.is_some(), "the workload did not count");
    checkpoint.ok();
    restore.ok();
    let after = after.expect("the restored workload does not count on");
    let last = *before.last().expect("numbers before the checkpoint");
    assert_eq!(
        after[before.len()],
        last + 1,
        "after {last} the restored workload printed {:?}",
        &after[before.len()..]
    );
}
