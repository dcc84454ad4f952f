//! The shim v2 process: `start` (spawn the long-running shim, print its
//! socket address), `delete` (containerd's cleanup after a shim died) and
//! the long-running server itself, on the `containerd-shim` framework.

use std::path::Path;
use std::sync::Arc;

use containerd_shim::api::DeleteResponse;
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::publisher::RemotePublisher;
use containerd_shim::util::write_address;
use containerd_shim::{Config, ExitSignal, Flags, StartOpts};

use crate::runtime::Agentvm;
use crate::task::Service;

/// The runtime name containerd knows this shim by.
pub const RUNTIME_ID: &str = "io.containerd.agentvm.v2";

/// The CRI annotation that names a container's pod sandbox: every
/// container of one pod is served by the same shim process.
const SANDBOX_ID_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";

pub struct Shim {
    namespace: String,
    id: String,
    bundle: String,
    exit: Arc<ExitSignal>,
}

/// The framework's options: it reaps every child (the containers' inits
/// are re-parented to the shim) and sets up the shim's log (containerd's
/// `log` FIFO in the bundle).
pub fn config() -> Config {
    Config::default()
}

impl containerd_shim::Shim for Shim {
    type T = Service;

    fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        Shim {
            namespace: args.namespace.clone(),
            id: args.id.clone(),
            bundle: args.bundle.clone(),
            exit: Arc::new(ExitSignal::default()),
        }
    }

    fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        // containerd runs `start` in the bundle.
        let grouping = sandbox_id(Path::new("config.json")).unwrap_or_else(|| opts.id.clone());
        let (_pid, address) = containerd_shim::spawn(opts, &grouping, Vec::new())?;
        write_address(&address)?;
        quiet_late_signals();
        Ok(address)
    }

    fn delete_shim(&mut self) -> containerd_shim::Result<DeleteResponse> {
        // containerd's cleanup after a shim that died: the container may
        // be gone already, which is what we want.
        let agentvm = Agentvm::new(&self.namespace);
        if let Err(e) = agentvm.delete(&self.id, true) {
            log::warn!("cleanup of {}: {e}", self.id);
        }
        let rootfs = if self.bundle.is_empty() {
            Path::new("rootfs").to_path_buf()
        } else {
            Path::new(&self.bundle).join("rootfs")
        };
        // Unmounted only if the shim mounted it (a snapshot), which the
        // bundle's own rootfs directory is not.
        if is_mount_point(&rootfs) {
            let _ = nix::mount::umount2(&rootfs, nix::mount::MntFlags::MNT_DETACH);
        }
        Ok(DeleteResponse {
            exit_status: 128 + 9,
            exited_at: MessageField::some(Timestamp::now()),
            ..Default::default()
        })
    }

    fn wait(&mut self) {
        self.exit.wait();
    }

    fn create_task_service(&self, publisher: RemotePublisher) -> Service {
        Service::new(
            publisher,
            &self.namespace,
            Agentvm::new(&self.namespace),
            Arc::clone(&self.exit),
        )
    }
}

/// Blocks SIGCHLD and SIGPIPE for the rest of `start`. The framework's
/// signal handlers (signal-hook, set up before `start_shim`) write to a
/// socket whose reading end goes away when `start` returns; a SIGCHLD after
/// that (the spawned copy exits at once when the pod's shim already runs)
/// made the handler's write fail with EPIPE, which raised SIGPIPE, whose
/// handler wrote again: `start` spun in that loop until containerd killed
/// it 120 s later, and StartContainer failed. Blocked, a late signal stays
/// pending until `start` exits. (Blocked only now: the spawned shim must
/// not inherit the mask.)
fn quiet_late_signals() {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGCHLD);
    set.add(Signal::SIGPIPE);
    if let Err(e) = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None) {
        log::warn!("cannot block SIGCHLD and SIGPIPE in start: {e}");
    }
}

/// The pod sandbox a bundle's container belongs to, from its config.json.
fn sandbox_id(config: &Path) -> Option<String> {
    let text = std::fs::read_to_string(config).ok()?;
    let spec: serde_json::Value = serde_json::from_str(&text).ok()?;
    spec.get("annotations")?
        .get(SANDBOX_ID_ANNOTATION)?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Whether `path` is a mount point (its device differs from its parent's).
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(me), Some(Ok(parent))) = (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) else {
        return false;
    };
    me.dev() != parent.dev()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_of_one_pod_share_a_shim() {
        let dir = std::env::temp_dir().join(format!("agentvm-shim-sandbox-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let config = dir.join("config.json");
        std::fs::write(
            &config,
            r#"{"annotations":{"io.kubernetes.cri.sandbox-id":"pod1","io.kubernetes.cri.container-type":"container"}}"#,
        )
        .expect("write config");
        assert_eq!(sandbox_id(&config).as_deref(), Some("pod1"));
        std::fs::write(&config, r#"{"annotations":{}}"#).expect("write config");
        assert_eq!(sandbox_id(&config), None);
        assert_eq!(sandbox_id(&dir.join("missing.json")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
