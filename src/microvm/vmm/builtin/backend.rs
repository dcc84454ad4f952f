//! The builtin VMM behind the backend seam: [`Builtin`] boots a
//! [`VmConfig`] as a [`Machine`] in the supervisor's own process, its
//! vCPUs and devices as threads, and [`BuiltinVm`] is the running VM the
//! supervisor watches and stops.
//!
//! What `launch` wires, as the QEMU backend does with its processes: the
//! control port's virtio-console on a connection to the supervisor's
//! control socket, the share as virtio-fs (served in process), one
//! virtio-net per tap (set to virtio 1.x's header, offloads off), the
//! serial port into the console log (the kernel's `console=ttyS0`; the
//! guest is booted `quiet`, and a boot that fails is diagnosed from this
//! log). No balloon: [`Vm::take_guest_ram`] has none to give.

use std::sync::Arc;
use std::thread::JoinHandle;

use super::machine::{self, MachineError, NicPort, Options};
use super::metrics::MachineCounters;
use super::park::Park;
use super::vcpu::{StopReason, StopSignal};
use crate::microvm::vmm::{Backend, Counters, Exited, GuestRam, Pauser, Vm, VmConfig, VmmError};

/// What a VM's parts are called in [`Exited`].
const PART: &str = "builtin VMM";

pub struct Builtin;

/// A VM run by [`Builtin`]: the thread that runs its [`Machine`] and the
/// signal that stops it.
///
/// [`Machine`]: super::machine::Machine
pub struct BuiltinVm {
    stop: Arc<StopSignal>,
    pauser: Arc<Parker>,
    counters: Arc<MachineCounters>,
    runner: Option<JoinHandle<Result<StopReason, MachineError>>>,
    ended: Option<Exited>,
}

fn setup(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmmError {
    let what = what.into();
    move |source| VmmError::Setup { what, source }
}

impl Backend for Builtin {
    fn name(&self) -> &'static str {
        "the builtin VMM"
    }

    fn launch(&self, config: &VmConfig) -> Result<Box<dyn Vm>, VmmError> {
        let name = config.control_socket.to_string_lossy();
        let control = crate::microvm::sock::connect(&config.run_dir, &name).map_err(setup(
            format!("connect {}", config.run_dir.join(&*name).display()),
        ))?;
        let console = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&config.console_log)
            .map_err(setup(format!("open {}", config.console_log.display())))?;
        let mut nics = Vec::new();
        for (i, nic) in config.nics.iter().enumerate() {
            use std::os::fd::AsFd;
            super::virtio::net::tap::configure(nic.tap.as_fd())
                .map_err(setup(format!("the header and offloads of tap {i}")))?;
            let fd = nic
                .tap
                .as_fd()
                .try_clone_to_owned()
                .map_err(setup(format!("a descriptor of tap {i}")))?;
            nics.push(NicPort { fd, mac: nic.mac });
        }
        let options = Options {
            serial: Some(console),
            entropy: None,
            control: Some(control),
            share: Some(config.share_dir.clone()),
            nics,
            jail: true,
        };
        launch_machine(config, options)
    }
}

/// Builds the machine and runs it on a thread of its own.
pub fn launch_machine(config: &VmConfig, options: Options) -> Result<Box<dyn Vm>, VmmError> {
    let m = machine::build(config, options)
        .map_err(|e| setup("the builtin VMM")(std::io::Error::other(e.to_string())))?;
    let stop = m.vm.stop.clone();
    let counters = Arc::new(m.counters.clone());
    let pauser = Arc::new(Parker {
        park: m.vm.park.clone(),
        stop: stop.clone(),
        vcpus: m.vcpus.len(),
    });
    let runner = std::thread::Builder::new()
        .name(format!(
            "vmm-{}",
            config.name.chars().take(10).collect::<String>()
        ))
        .spawn(move || m.run())
        .map_err(|source| VmmError::Spawn {
            what: "the builtin VMM's thread",
            source,
        })?;
    Ok(Box::new(BuiltinVm {
        stop,
        pauser,
        counters,
        runner: Some(runner),
        ended: None,
    }))
}

/// How a run that returned reads in [`Exited`].
fn how(result: std::thread::Result<Result<StopReason, MachineError>>) -> String {
    match result {
        Ok(Ok(StopReason::Reset)) => "the guest reset the VM".into(),
        Ok(Ok(StopReason::Shutdown)) => "the guest shut down (triple fault)".into(),
        Ok(Ok(StopReason::Halted)) => "the guest halted".into(),
        Ok(Ok(StopReason::SystemEvent(t))) => format!("the guest's system event {t}"),
        Ok(Ok(StopReason::Requested)) => "stopped by the supervisor".into(),
        Ok(Err(e)) => format!("failed: {e}"),
        Err(_) => "a thread of the VMM panicked".into(),
    }
}

impl Vm for BuiltinVm {
    fn exited(&mut self) -> Option<Exited> {
        if self.ended.is_none() && self.runner.as_ref().is_some_and(|r| r.is_finished()) {
            if let Some(runner) = self.runner.take() {
                self.ended = Some(Exited {
                    part: PART,
                    how: how(runner.join()),
                });
            }
        }
        self.ended.clone()
    }

    fn kill(&mut self) {
        self.stop.request(StopReason::Requested);
        if let Some(runner) = self.runner.take() {
            self.ended = Some(Exited {
                part: PART,
                how: how(runner.join()),
            });
        }
    }

    fn host_pids(&self) -> Vec<i32> {
        // Threads of the supervisor, no process of their own.
        Vec::new()
    }

    fn take_guest_ram(&mut self) -> Option<Box<dyn GuestRam>> {
        None
    }

    fn pauser(&self) -> Option<Arc<dyn Pauser>> {
        Some(self.pauser.clone())
    }

    fn counters(&self) -> Option<Arc<dyn Counters>> {
        Some(self.counters.clone())
    }
}

impl Counters for MachineCounters {
    fn read(&self) -> crate::protocol::VmmCounters {
        MachineCounters::read(self)
    }
}

/// Pauses a builtin VM by parking its vCPUs ([`Park`]).
struct Parker {
    park: Arc<Park>,
    stop: Arc<StopSignal>,
    vcpus: usize,
}

impl Pauser for Parker {
    fn pause(&self) -> Result<(), String> {
        self.park
            .pause(self.vcpus, &self.stop)
            .map_err(|e| e.to_string())
    }

    fn resume(&self) {
        self.park.resume();
    }

    fn paused(&self) -> bool {
        self.park.paused()
    }
}

impl Drop for BuiltinVm {
    fn drop(&mut self) {
        self.kill();
    }
}
