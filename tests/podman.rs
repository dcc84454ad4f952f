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
