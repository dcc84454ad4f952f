//! agentvm: an OCI runtime, command-line compatible with runc, that runs each
//! container at the isolation tier its operator picks.
//!
//! Data flows one way: [`cli`] parses a command and picks the container's
//! [`tier`] once; the tier ([`container`] or [`microvm`]) does the work; the
//! microvm tier drives a VMM backend ([`microvm::vmm`]) and speaks the
//! control protocol ([`protocol`]) to the guest agent ([`guest`]), which is
//! this same binary booted as the VM's `/init` and reuses the container tier
//! inside the guest.

pub mod audit;
pub mod bundle;
pub mod cli;
pub mod config;
pub mod container;
pub mod context;
pub mod dns_relay;
pub mod egress;
pub mod guest;
pub mod jail;
pub mod logging;
pub mod microvm;
pub mod ndp;
pub mod netlink;
pub mod router;
pub mod signal;
pub mod state;
pub mod term;
pub mod tier;

/// The host↔guest control protocol (its own crate, so the hostile-guest
/// test agents and the fuzz targets link the real decoder).
pub use agentvm_protocol as protocol;
