//! containerd's CRI, driven as the kubelet drives it: a containerd of the
//! tests with its CRI plugin on, pods on a CNI bridge of Debian's
//! `containernetworking-plugins`, and a CRI client over gRPC (`k8s-cri`,
//! tonic) on containerd's socket. Debian has no `crictl`.
//!
//! Runtime handlers (`RunPodSandboxRequest.runtime_handler`, what a
//! `RuntimeClass` names): `runc` (containerd's runc shim, the reference)
//! and `agentvm` (`io.containerd.agentvm.v2`, this build's shim first in
//! containerd's `PATH`), to which the pod's and containers' `io.agentvm.*`
//! annotations pass, so a pod picks agentvm's tier as a container does.
//!
//! Images: the busybox rootfs imported into CRI's containerd namespace
//! (`k8s.io`) as [`BUSYBOX`], and as [`PAUSE`], the sandbox image, whose
//! command sleeps (no registry is reachable).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerStatsRequest, ContainerStatusRequest,
    CreateContainerRequest, ExecRequest, ExecSyncRequest, ImageSpec, KeyValue,
    LinuxContainerConfig, LinuxContainerResources, ListContainersRequest, PodSandboxConfig,
    PodSandboxMetadata, PodSandboxStatusRequest, RemoveContainerRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

use super::containerd::{ensure_daemon, oci_archive, Instance};
use super::{cmd, host_unsuitable, rootfs, RUN_DIR};

/// containerd's namespace for what CRI creates.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// The busybox image, by the name CRI normalises `local/busybox` to.
pub const BUSYBOX: &str = "docker.io/local/busybox:latest";
/// The sandbox ("pause") image: busybox whose command sleeps.
pub const PAUSE: &str = "docker.io/local/pause:latest";
/// The runtime handler of containerd's runc shim.
pub const HANDLER_RUNC: &str = "runc";
/// The runtime handler of agentvm's shim.
pub const HANDLER_AGENTVM: &str = "agentvm";
/// A handler of agentvm's shim that picks the container tier with a config
/// file of its own (its `ConfigPath` option), as a `RuntimeClass`
/// `agentvm-container` would: no pod annotation needed.
pub const HANDLER_AGENTVM_CONTAINER: &str = "agentvm-container";
/// What that file says: the container tier.
const CONTAINER_TIER_CONFIG: &str = "isolation = \"container\"\n";
/// The config file [`HANDLER_AGENTVM_CONTAINER`] names.
pub fn container_tier_config() -> PathBuf {
    Path::new(RUN_DIR).join("containerd-cri/agentvm-container.toml")
}
/// The pods' CNI network: a bridge of its own, addresses from host-local.
const BRIDGE: &str = "avcri0";
const SUBNET: &str = "10.244.77.0/24";

/// The CRI plugin's configuration of the tests' containerd.
/// `restrict_oom_score_adj`: CRI asks for -998 for a pod's sandbox, which
/// needs CAP_SYS_RESOURCE; where root lacks it (these machines' root does),
/// runc's init fails to write it. CRI then keeps containerd's own score.
fn cri_config(dir: &Path) -> String {
    format!(
        "\n[plugins.\"io.containerd.grpc.v1.cri\"]\n\
         \x20 sandbox_image = \"{PAUSE}\"\n\
         \x20 restrict_oom_score_adj = true\n\
         \x20 [plugins.\"io.containerd.grpc.v1.cri\".cni]\n\
         \x20   bin_dir = \"/usr/lib/cni\"\n\
         \x20   conf_dir = \"{}\"\n\
         \x20 [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n\
         \x20   default_runtime_name = \"{HANDLER_RUNC}\"\n\
         \x20   [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.{HANDLER_RUNC}]\n\
         \x20     runtime_type = \"io.containerd.runc.v2\"\n\
         \x20   [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.{HANDLER_AGENTVM}]\n\
         \x20     runtime_type = \"io.containerd.agentvm.v2\"\n\
         \x20     pod_annotations = [\"io.agentvm.*\"]\n\
         \x20     container_annotations = [\"io.agentvm.*\"]\n\
         \x20   [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.{HANDLER_AGENTVM_CONTAINER}]\n\
         \x20     runtime_type = \"io.containerd.agentvm.v2\"\n\
         \x20     [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.{HANDLER_AGENTVM_CONTAINER}.options]\n\
         \x20       ConfigPath = \"{}\"\n",
        dir.join("cni").display(),
        container_tier_config().display()
    )
}

/// The CNI network list the pods join.
fn cni_config() -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "agentvm-cri",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

/// The CRI of the tests' CRI containerd.
pub struct Cri {
    instance: Instance,
    rt: tokio::runtime::Runtime,
    channel: Channel,
}

/// The shared fixture: containerd with CRI is up, the images imported.
pub fn cri() -> Result<&'static Cri, String> {
    static CRI: OnceLock<Result<Cri, String>> = OnceLock::new();
    CRI.get_or_init(|| {
        if let Some(why) = host_unsuitable(&["containerd", "ctr", "containerd-shim-runc-v2"]) {
            return Err(why);
        }
        if !Path::new("/usr/lib/cni/bridge").is_file() {
            return Err(
                "no CNI plugins in /usr/lib/cni (Debian package containernetworking-plugins)"
                    .into(),
            );
        }
        let shim_dir = super::built_shim_dir();
        let dir = Path::new(RUN_DIR).join("containerd-cri");
        std::fs::create_dir_all(dir.join("cni")).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("cni/10-agentvm-cri.conflist"), cni_config())
            .map_err(|e| e.to_string())?;
        std::fs::write(container_tier_config(), CONTAINER_TIER_CONFIG)
            .map_err(|e| e.to_string())?;
        std::fs::write(container_tier_config(), "isolation = \"container\"\n")
            .map_err(|e| e.to_string())?;
        let instance = Instance {
            name: "containerd-cri",
            path_first: Some(shim_dir),
            cri: Some(cri_config(&dir)),
        };
        ensure_daemon(&instance);
        import(&instance, "busybox-cri", BUSYBOX, &["sh"]);
        import(&instance, "pause-cri", PAUSE, &["sleep", "2147483647"]);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let socket = instance.socket();
        let channel = rt
            .block_on(async move {
                Endpoint::try_from("http://[::]:50051")?
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let socket = socket.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                tokio::net::UnixStream::connect(socket).await?,
                            ))
                        }
                    }))
                    .await
            })
            .map_err(|e| format!("cannot connect to CRI: {e}"))?;
        Ok(Cri {
            instance,
            rt,
            channel,
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Imports the busybox layer as `image` (`docker.io/local/NAME:latest`)
/// with command `cmd` into CRI's namespace.
fn import(instance: &Instance, archive_name: &str, image: &str, cmd: &[&str]) {
    let archive = oci_archive(&rootfs::tarball(), archive_name, cmd);
    let base = image.trim_end_matches(":latest");
    let out = cmd::run(
        instance
            .ctr_in(CRI_NAMESPACE)
            .args(["image", "import", "--base-name", base])
            .arg(&archive),
    );
    assert!(out.success(), "ctr image import {image}: {}", out.stderr);
}

/// A pod's sandbox as the tests ask for it.
pub struct PodSpec<'a> {
    pub name: &'a str,
    pub handler: &'a str,
    /// The pod's annotations (`io.agentvm.isolation` picks the tier).
    pub annotations: &'a [(&'a str, &'a str)],
}

/// A pod the tests created: its id and the config it was created with
/// (CreateContainer takes it again).
pub struct Pod {
    pub id: String,
    pub config: PodSandboxConfig,
    pub log_dir: PathBuf,
}

/// What ExecSync returned.
#[derive(Debug)]
pub struct ExecResult {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
}

/// What ContainerStats reports of a container.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub cpu_ns: u64,
    pub working_set: u64,
    pub usage: u64,
}

/// A container's state and exit code as ContainerStatus reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerState {
    /// CONTAINER_CREATED, CONTAINER_RUNNING, CONTAINER_EXITED, ...
    pub state: String,
    pub exit_code: i32,
    pub reason: String,
}

impl Cri {
    fn client(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone())
    }

    fn call<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, String> {
        self.rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(120), fut).await })
            .map_err(|_| format!("{what}: no answer in 120 s"))?
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("{what}: {}: {}", s.code(), s.message()))
    }

    /// RunPodSandbox; its log directory is made fresh under RUN_DIR.
    pub fn run_pod(&self, spec: &PodSpec) -> Result<Pod, String> {
        let log_dir = Path::new(RUN_DIR).join("cri-logs").join(spec.name);
        let _ = std::fs::remove_dir_all(&log_dir);
        std::fs::create_dir_all(&log_dir).map_err(|e| e.to_string())?;
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: spec.name.into(),
                uid: format!("uid-{}", spec.name),
                namespace: "agentvm-test".into(),
                attempt: 0,
            }),
            hostname: spec.name.into(),
            log_directory: log_dir.to_string_lossy().into_owned(),
            annotations: spec
                .annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let mut client = self.client();
        let reply = self.call(
            "RunPodSandbox",
            client.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: spec.handler.into(),
            }),
        )?;
        Ok(Pod {
            id: reply.pod_sandbox_id,
            config,
            log_dir,
        })
    }

    /// CreateContainer + StartContainer of `command` in the pod, its log
    /// at `<pod log dir>/<name>.log`; returns the container's id.
    pub fn start_container(
        &self,
        pod: &Pod,
        name: &str,
        command: &[&str],
        annotations: &[(&str, &str)],
    ) -> Result<String, String> {
        self.start_container_limited(pod, name, command, annotations, None)
    }

    /// As [`Cri::start_container`], with the container's memory limit in
    /// bytes (`linux.resources.memory_limit_in_bytes`, what a pod spec's
    /// `resources.limits.memory` becomes), if any.
    pub fn start_container_limited(
        &self,
        pod: &Pod,
        name: &str,
        command: &[&str],
        annotations: &[(&str, &str)],
        memory_limit: Option<i64>,
    ) -> Result<String, String> {
        let linux = memory_limit.map(|limit| LinuxContainerConfig {
            resources: Some(LinuxContainerResources {
                memory_limit_in_bytes: limit,
                ..Default::default()
            }),
            ..Default::default()
        });
        let config = ContainerConfig {
            linux,
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: BUSYBOX.into(),
                ..Default::default()
            }),
            command: command.iter().map(|s| s.to_string()).collect(),
            envs: vec![KeyValue {
                key: "AGENTVM_TEST".into(),
                value: name.into(),
            }],
            log_path: format!("{name}.log"),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let mut client = self.client();
        let id = self
            .call(
                "CreateContainer",
                client.create_container(CreateContainerRequest {
                    pod_sandbox_id: pod.id.clone(),
                    config: Some(config),
                    sandbox_config: Some(pod.config.clone()),
                }),
            )?
            .container_id;
        self.call(
            "StartContainer",
            client.start_container(StartContainerRequest {
                container_id: id.clone(),
            }),
        )?;
        Ok(id)
    }

    /// ExecSync of `cmd` in a container, with a timeout in seconds.
    pub fn exec_sync(&self, container: &str, cmd: &[&str]) -> Result<ExecResult, String> {
        let mut client = self.client();
        let reply = self.call(
            "ExecSync",
            client.exec_sync(ExecSyncRequest {
                container_id: container.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout: 60,
            }),
        )?;
        Ok(ExecResult {
            stdout: String::from_utf8_lossy(&reply.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&reply.stderr).into_owned(),
            exit_code: reply.exit_code,
        })
    }

    /// CRI's streaming exec of `cmd` (stdout and stderr, no stdin, no
    /// terminal): the Exec RPC's URL on containerd's streaming server,
    /// then a websocket with the subprotocol `protocol`
    /// ([`super::wsexec`]).
    pub fn exec_stream(
        &self,
        container: &str,
        cmd: &[&str],
        protocol: &str,
    ) -> Result<super::wsexec::Streamed, String> {
        let mut client = self.client();
        let url = self
            .call(
                "Exec",
                client.exec(ExecRequest {
                    container_id: container.into(),
                    cmd: cmd.iter().map(|s| s.to_string()).collect(),
                    tty: false,
                    stdin: false,
                    stdout: true,
                    stderr: true,
                }),
            )?
            .url;
        super::wsexec::run(&url, protocol).map_err(|e| format!("exec stream {url}: {e}"))
    }

    /// ContainerStats: the container's cumulative CPU time (ns), memory
    /// working set and usage (bytes), 0 where CRI gives none.
    pub fn container_stats(&self, container: &str) -> Result<Usage, String> {
        let mut client = self.client();
        let stats = self
            .call(
                "ContainerStats",
                client.container_stats(ContainerStatsRequest {
                    container_id: container.into(),
                }),
            )?
            .stats
            .ok_or("ContainerStats without stats")?;
        let value = |v: Option<k8s_cri::v1::UInt64Value>| v.map_or(0, |v| v.value);
        let memory = stats.memory.unwrap_or_default();
        Ok(Usage {
            cpu_ns: value(stats.cpu.and_then(|c| c.usage_core_nano_seconds)),
            working_set: value(memory.working_set_bytes),
            usage: value(memory.usage_bytes),
        })
    }

    /// ContainerStatus: the state's name and the exit code.
    pub fn container_state(&self, container: &str) -> Result<ContainerState, String> {
        let mut client = self.client();
        let status = self
            .call(
                "ContainerStatus",
                client.container_status(ContainerStatusRequest {
                    container_id: container.into(),
                    verbose: false,
                }),
            )?
            .status
            .ok_or("ContainerStatus without a status")?;
        let state = k8s_cri::v1::ContainerState::try_from(status.state)
            .map(|s| s.as_str_name().to_string())
            .unwrap_or_else(|_| format!("state {}", status.state));
        Ok(ContainerState {
            state,
            exit_code: status.exit_code,
            reason: status.reason,
        })
    }

    /// Waits up to `secs` for a container to reach CONTAINER_EXITED.
    pub fn wait_exited(&self, container: &str, secs: u64) -> Result<ContainerState, String> {
        let mut last = None;
        super::wait_for(secs, || {
            let s = self.container_state(container).ok()?;
            let exited = s.state == "CONTAINER_EXITED";
            last = Some(s.clone());
            exited.then_some(s)
        })
        .ok_or_else(|| format!("container {container} did not exit in {secs} s: {last:?}"))
    }

    /// StopContainer (with a grace period) and RemoveContainer.
    pub fn remove_container(&self, container: &str) -> Result<(), String> {
        let mut client = self.client();
        self.call(
            "StopContainer",
            client.stop_container(StopContainerRequest {
                container_id: container.into(),
                timeout: 5,
            }),
        )?;
        self.call(
            "RemoveContainer",
            client.remove_container(RemoveContainerRequest {
                container_id: container.into(),
            }),
        )?;
        Ok(())
    }

    /// The ids of the pod's containers CRI still lists.
    pub fn containers_of(&self, pod: &Pod) -> Result<Vec<String>, String> {
        let mut client = self.client();
        let list = self.call(
            "ListContainers",
            client.list_containers(ListContainersRequest { filter: None }),
        )?;
        Ok(list
            .containers
            .into_iter()
            .filter(|c| c.pod_sandbox_id == pod.id)
            .map(|c| c.id)
            .collect())
    }

    /// The pod's IPv4 address from PodSandboxStatus.
    pub fn pod_ip(&self, pod: &Pod) -> Result<String, String> {
        let mut client = self.client();
        let status = self.call(
            "PodSandboxStatus",
            client.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: pod.id.clone(),
                verbose: false,
            }),
        )?;
        status
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| "PodSandboxStatus has no pod IP".into())
    }

    /// StopPodSandbox and RemovePodSandbox.
    pub fn remove_pod(&self, pod: &Pod) -> Result<(), String> {
        let mut client = self.client();
        self.call(
            "StopPodSandbox",
            client.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: pod.id.clone(),
            }),
        )?;
        self.call(
            "RemovePodSandbox",
            client.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: pod.id.clone(),
            }),
        )?;
        Ok(())
    }

    /// `ctr` in CRI's namespace of this containerd.
    pub fn ctr(&self, args: &[&str]) -> cmd::Output {
        cmd::run(self.instance.ctr_in(CRI_NAMESPACE).args(args))
    }
}
