//! The microvm tier behind the [`crate::tier::Tier`] seam: each runc
//! command answered by the container's supervisor and its guest.

use libcgroups::stats::Stats;
use nix::unistd::Pid;
use oci_spec::runtime::LinuxResources;

use super::vmstate::VmState;
use super::{refused, MicrovmError};
use crate::config::Isolation;
use crate::context::Context;
use crate::tier::{self, CreateRequest, ExecRequest, OomWatch, ProcessTable, RuncState, TierError};

/// Containers in their own microVM.
pub struct Tier;

/// The OOM kills the guest counts in the container's cgroup.
struct GuestOom {
    id: String,
}

impl OomWatch for GuestOom {
    fn kills(&mut self, ctx: &Context) -> tier::Result<u64> {
        match super::stats(ctx, &self.id) {
            Ok((stats, _)) => Ok(stats.oom_kills),
            Err(e) => {
                // Once the VM has ended, the count its supervisor kept.
                let state = VmState::load(&ctx.container_dir(&self.id))?;
                match (state.effective_status(), state.oom_kills) {
                    (super::vmstate::Status::Stopped, Some(kills)) => Ok(kills),
                    _ => Err(e.into()),
                }
            }
        }
    }
}

impl tier::Tier for Tier {
    fn isolation(&self) -> Isolation {
        Isolation::Microvm
    }

    fn create(&self, ctx: &Context, req: &CreateRequest) -> tier::Result<()> {
        if req.preserve_fds > 0 {
            return Err(TierError::unsupported(
                "--preserve-fds",
                Isolation::Microvm,
                ": host descriptors cannot cross into the guest",
            ));
        }
        super::create(
            ctx,
            req.id,
            req.bundle,
            super::CreateOptions {
                console_socket: req.console_socket,
                pid_file: req.pid_file,
                log: ctx.log.as_deref(),
                log_json: ctx.log_json,
                egress: req.egress,
            },
        )?;
        Ok(())
    }

    fn start(&self, ctx: &Context, id: &str) -> tier::Result<()> {
        Ok(super::start(ctx, id)?)
    }

    fn state(&self, ctx: &Context, id: &str) -> tier::Result<RuncState> {
        Ok(super::state(ctx, id)?)
    }

    fn kill(&self, ctx: &Context, id: &str, signal: i32, all: bool) -> tier::Result<()> {
        Ok(super::kill(ctx, id, signal, all)?)
    }

    fn delete(&self, ctx: &Context, id: &str, force: bool) -> tier::Result<()> {
        Ok(super::delete(ctx, id, force)?)
    }

    fn pause(&self, ctx: &Context, id: &str) -> tier::Result<()> {
        Ok(super::set_paused(ctx, id, true)?)
    }

    fn resume(&self, ctx: &Context, id: &str) -> tier::Result<()> {
        Ok(super::set_paused(ctx, id, false)?)
    }

    fn host_pids(&self, ctx: &Context, id: &str) -> tier::Result<Vec<i32>> {
        Ok(super::ps(ctx, id)?)
    }

    fn process_table(
        &self,
        ctx: &Context,
        id: &str,
        ps_args: &[String],
    ) -> tier::Result<ProcessTable> {
        // The workload's processes live in the guest: list them there.
        if !ps_args.is_empty() {
            return Err(TierError::unsupported(
                "ps arguments",
                Isolation::Microvm,
                ": the guest's processes are listed by agentvm (PID PPID UID CMD)",
            ));
        }
        // A stopped container has no processes (runc prints the header
        // alone); a paused one's are listed, frozen, as runc lists them.
        if super::state(ctx, id)?.status == "stopped" {
            return Ok(ProcessTable::Guest(Vec::new()));
        }
        Ok(ProcessTable::Guest(super::guest_processes(ctx, id)?))
    }

    /// What the guest reports of the container's cgroup in the guest, in
    /// the container tier's shape; the memory limit is the container's in
    /// the guest, or the guest's RAM when it has none.
    fn stats(&self, ctx: &Context, id: &str) -> tier::Result<Option<crate::events::Stats>> {
        if !matches!(super::state(ctx, id)?.status, "running" | "paused") {
            return Ok(None);
        }
        let (guest, vmm) = super::stats(ctx, id)?;
        let mut stats = Stats::default();
        stats.cpu.usage.usage_total = guest.cpu_usage_ns;
        stats.memory.memory.usage = guest.memory_usage_bytes;
        stats.memory.memory.limit = match guest.memory_limit_bytes {
            0 => guest.memory_total_bytes,
            limit => limit.min(guest.memory_total_bytes),
        };
        stats.memory.stats.extend([
            ("guest_total".to_string(), guest.memory_total_bytes),
            ("guest_available".to_string(), guest.memory_available_bytes),
        ]);
        stats.pids.current = guest.pids;
        // The guest's cpuset is not reported: its figures stay zero.
        let stats = crate::events::Stats::from_cgroup(&stats, Default::default());
        Ok(Some(match vmm {
            Some(counters) => stats.with_vmm(counters),
            None => stats,
        }))
    }

    /// The guest counts the OOM kills of the container's cgroup in the
    /// guest; each `kills` asks it (through the supervisor).
    fn oom_watch(&self, ctx: &Context, id: &str) -> tier::Result<Box<dyn OomWatch>> {
        let mut watch = GuestOom { id: id.to_string() };
        watch.kills(ctx)?;
        Ok(Box::new(watch))
    }

    fn update(&self, ctx: &Context, id: &str, resources: &LinuxResources) -> tier::Result<()> {
        Ok(super::update(ctx, id, resources)?)
    }

    fn exec(&self, ctx: &Context, req: &ExecRequest) -> tier::Result<u8> {
        if req.preserve_fds > 0 {
            return Err(TierError::unsupported(
                "exec --preserve-fds",
                Isolation::Microvm,
                ": host descriptors cannot cross into the guest",
            ));
        }
        // Refused here with runc's words rather than after a trip to the
        // guest (which parses them again: its cgroups are where they apply).
        crate::container::cgroups::parse_sub_cgroups(req.cgroup)
            .map_err(super::MicrovmError::from)?;
        let status = super::exec::exec(
            ctx,
            req.id,
            super::exec::ExecRequest {
                process: req.process,
                console_socket: req.console_socket,
                pid_file: req.pid_file,
                detach: req.detach,
                ignore_paused: req.ignore_paused,
                cgroup: req.cgroup,
            },
        )?;
        Ok(status)
    }

    /// The supervisor: the caller's child, so its pid cannot be reused
    /// before it is reaped; `state` would say pid 0 once it has exited (a
    /// workload or a guest that ends right after start).
    fn init_pid(&self, ctx: &Context, id: &str) -> tier::Result<Pid> {
        let state = VmState::load(&ctx.container_dir(id)).map_err(MicrovmError::from)?;
        state
            .supervisor_pid
            .map(Pid::from_raw)
            .ok_or_else(|| refused(format!("container {id} has no supervisor")).into())
    }
}
