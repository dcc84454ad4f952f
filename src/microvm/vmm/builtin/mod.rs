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
//! host of `make test-builtin`. It cannot run a container yet: [`MISSING`]
//! says what it lacks, and `vmm = "builtin"` is refused until that list is
//! empty.

pub mod boot;
pub mod bus;
pub mod cpu;
pub mod layout;
pub mod legacy;
pub mod machine;
pub mod memory;
pub mod mptable;
pub mod vcpu;
pub mod virtio;
pub mod vm;

#[cfg(test)]
mod kvm_tests;
#[cfg(test)]
mod linux_tests;

/// What the builtin VMM needs before it can boot a container's guest.
/// `auto` never picks it and `builtin` is refused while this is not
/// empty.
pub const MISSING: &[&str] = &["the supervisor's launch of it"];

/// Whether the builtin VMM can run containers.
pub fn complete() -> bool {
    MISSING.is_empty()
}
