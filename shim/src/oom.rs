//! `TaskOOM`: an OOM kill in a container, from the `oom` lines of
//! `agentvm events <id>`, which both tiers print: the container tier
//! counts the kills in the container's memory cgroup on the host
//! (`memory.events` or `memory.oom_control`), the microvm tier asks the
//! guest, whose kernel does the killing. One such command runs per
//! container from its create on; it ends by itself once the container has
//! stopped (after a last look, so a kill that ended the container is
//! reported) or is gone; when the init exits the shim wakes it (SIGURG)
//! for that last look at once.

use std::io::{BufRead, BufReader};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use containerd_shim::protos::events::task::TaskOOM;
use containerd_shim::protos::topics;

use crate::process::Shared;
use crate::runtime::{Agentvm, RuntimeError};

/// One line of `agentvm events`; only the type matters here.
#[derive(serde::Deserialize)]
struct Line {
    #[serde(rename = "type")]
    kind: String,
}

/// A running watch: done once `agentvm events` has ended, i.e. after its
/// last look at a stopped container.
#[derive(Default)]
pub struct Watch {
    done: Mutex<bool>,
    ended: Condvar,
    /// The `agentvm events` process.
    pid: Option<i32>,
}

impl Watch {
    /// Asks `agentvm events` for its last look now (SIGURG cuts its wait
    /// between looks short) rather than at its next one, up to a second
    /// later: the container's init has exited.
    pub fn wake(&self) {
        let done = *self
            .done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let (false, Some(pid)) = (done, self.pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGURG,
            );
        }
    }

    fn finish(&self) {
        *self
            .done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        self.ended.notify_all();
    }

    /// Waits (at most `limit`) for the watch to end, so that the init's
    /// exit is reported after the OOM kill that caused it.
    pub fn wait(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut done = self
            .done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while !*done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                log::warn!(
                    "agentvm events still running {} ms after the exit",
                    limit.as_millis()
                );
                return;
            }
            done = self
                .ended
                .wait_timeout(done, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

/// Starts watching container `id` for OOM kills, counted from its create
/// on (`--oom-since-create`: a workload killed before the command's first
/// look is reported too).
pub fn watch(
    agentvm: &Agentvm,
    shared: &Arc<Shared>,
    id: &str,
) -> Result<Arc<Watch>, RuntimeError> {
    let mut child = agentvm.spawn_events(id)?;
    let watch = Arc::new(Watch {
        pid: i32::try_from(child.id()).ok(),
        ..Watch::default()
    });
    if let Some(stderr) = child.stderr.take() {
        let id = id.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                log::warn!("agentvm events {id}: {line}");
            }
        });
    }
    let Some(stdout) = child.stdout.take() else {
        watch.finish();
        return Ok(watch);
    };
    let shared = Arc::clone(shared);
    let id = id.to_string();
    let finished = Arc::clone(&watch);
    // The command's exit is reaped by the framework's reaper (and filed
    // as an unclaimed exit): `child` is not waited for.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let Ok(event) = serde_json::from_str::<Line>(&line) else {
                log::warn!("agentvm events {id}: not an event line: {line}");
                continue;
            };
            if event.kind == "oom" {
                log::info!("container {id}: OOM kill");
                shared.publish(
                    topics::TASK_OOM_EVENT_TOPIC,
                    Box::new(TaskOOM {
                        container_id: id.clone(),
                        ..Default::default()
                    }),
                );
            }
        }
        finished.finish();
    });
    Ok(watch)
}
