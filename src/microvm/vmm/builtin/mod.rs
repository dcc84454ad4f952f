//! The builtin VMM: our own VMM on rust-vmm crates, for hosts with
//! hardware virtualization (issue 12, docs/builtin-vmm.md).
//!
//! Phase 1 is the core and its first device: guest memory on a memfd
//! ([`memory`]), the VM and its interrupt controller ([`vm`]), vCPUs
//! entering a kernel through PVH ([`cpu`], [`boot`], [`mptable`]) and
//! dispatching their exits to the buses ([`vcpu`], [`bus`]), the serial
//! port and the reset line ([`legacy`]), and virtio-mmio with virtio-rng
//! ([`virtio`]). Phase 2 boots the real guest kernel to its `/init`, which
//! on our machines (`/dev/kvm` is `kvm_pvm`) happens only inside the test
//! host of `make test-builtin`. Phase 3 adds virtio-fs, virtio-net and
//! the backend the supervisor launches ([`backend`]), which runs the microvm
//! tier's containers (their tests run under it inside the test host).
//! Its threads jail themselves ([`jail`]), so [`MISSING`] is empty and
//! `auto` picks it wherever the host has a standard hardware KVM.

pub mod backend;
pub mod boot;
pub mod bus;
pub mod cpu;
pub mod jail;
pub mod layout;
pub mod legacy;
pub mod machine;
pub mod memory;
pub mod metrics;
pub mod mptable;
pub mod park;
pub mod vcpu;
pub mod virtio;
pub mod vm;

#[cfg(test)]
mod kvm_tests;
#[cfg(test)]
mod linux_tests;

/// What the builtin VMM lacks before `auto` may pick it (an explicit
/// `builtin` runs with a warning naming this). Empty since its threads
/// jail themselves ([`jail`]): a list again if a part it needs to run
/// containers safely goes missing.
pub const MISSING: &[&str] = &[];

/// Whether the builtin VMM can run containers.
pub fn complete() -> bool {
    MISSING.is_empty()
}
