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
//! the backend the supervisor launches ([`backend`]). It cannot run a
//! container yet: [`MISSING`] says what it lacks, and `vmm = "builtin"` is
//! refused until that list is empty.

pub mod backend;
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
/// empty. The supervisor's launch exists ([`backend`]) but has not run a
/// container with the guest agent yet (that needs the microvm tier's
/// tests inside the test host), and the supervisor's steady-state jail
/// (capabilities and seccomp are per thread) does not yet cover the
/// VMM's threads.
pub const MISSING: &[&str] = &[
    "a container run under it end to end (the microvm tier's tests in the test host)",
    "the supervisor's jail for its vCPU and device threads",
];

/// Whether the builtin VMM can run containers.
pub fn complete() -> bool {
    MISSING.is_empty()
}
