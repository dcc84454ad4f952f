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
