//! containerd end to end: a dedicated containerd, driven by `ctr run
//! --runc-binary <agentvm>`, the tier chosen by the OCI annotation
//! `io.agentvm.isolation=container` (see tests/support/src/containerd.rs).
//! `AGENTVM_TEST_RUNTIME=runc` runs the same checks with runc.
//!
//!     cargo test --test containerd -- --nocapture

use agentvm_test_support as common;
use common::require;

use common::containerd::containerd;
use common::{expects_host_kernel, host_boot_id, unique_name};

#[test]
fn ctr_run_rm_echo() {
    let c = require!(containerd());
    let out = c
        .run_rm(&unique_name("echo"), &["echo", "hello from containerd"])
        .ok();
    assert_eq!(out.stdout, "hello from containerd\n");
}

#[test]
fn ctr_exit_code_is_propagated() {
    let c = require!(containerd());
    c.run_rm(&unique_name("exit"), &["sh", "-c", "exit 42"])
        .code(42);
    c.run_rm(&unique_name("true"), &["true"]).code(0);
}

#[test]
fn ctr_annotation_picks_the_tier() {
    let c = require!(containerd());
    let out = c
        .run_rm(
            &unique_name("tier"),
            &["cat", "/proc/sys/kernel/random/boot_id"],
        )
        .ok();
    let same = out.out() == host_boot_id();
    assert_eq!(same, expects_host_kernel(&c.runtime), "{out}");
}
