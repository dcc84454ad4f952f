//! `containerd-shim-agentvm-v2`: containerd's shim v2 for agentvm
//! (runtime `io.containerd.agentvm.v2`). See shim/README.md.
//!
//! containerd runs this binary with `start` (spawn the long-running shim
//! and print its socket address), with `delete` (clean up after a shim
//! that died), and the spawned copy serves containerd's task API over
//! ttrpc on that socket until containerd shuts it down.

mod console;
mod metrics;
mod oom;
mod options;
mod process;
mod runtime;
mod shim;
mod stdio;
mod task;

fn main() {
    // The framework parses containerd's flags (-namespace, -id, -address,
    // -publish-binary, -bundle, -debug), prints errors and sets the exit
    // status itself.
    containerd_shim::run::<shim::Shim>(shim::RUNTIME_ID, Some(shim::config()));
}
