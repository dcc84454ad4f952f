//! A dedicated containerd (no CRI) driven with `ctr`.
//!
//! `ctr run --runc-binary` makes the runc shim (io.containerd.runc.v2) call
//! agentvm in place of runc. ctr cannot add global runtime flags, so the
//! tier travels in the OCI annotation `io.agentvm.isolation`, which agentvm
//! reads from config.json. (The shim passes containerd's environment on to
//! the runtime, so `AGENTVM_CONFIG` set for containerd would work too.)
//! The container's rootfs is an unpacked busybox tree (`--rootfs`).
//!
//! [`containerd_for_shim`] is a second containerd whose `PATH` starts with
//! the directory of the `containerd-shim-agentvm-v2` binary under test, so
//! that `ctr run --runtime io.containerd.agentvm.v2` finds that shim (and
//! the shim the `agentvm` beside it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::cmd::{self, Output};
use super::{daemon, host_unsuitable, rootfs, Runtime, DATA_DIR, ISOLATION_ANNOTATION, RUN_DIR};

/// The containerd namespace the tests use.
pub const NAMESPACE: &str = "agentvm-test";

pub struct Containerd {
    pub runtime: Runtime,
    rootfs: PathBuf,
    instance: Instance,
}

/// One containerd of the tests: its name under [`RUN_DIR`], the
/// directory put first in its `PATH`, if any, and the configuration of its
/// CRI plugin (disabled when `None`).
#[derive(Clone)]
pub(crate) struct Instance {
    pub(crate) name: &'static str,
    pub(crate) path_first: Option<PathBuf>,
    pub(crate) cri: Option<String>,
}

/// The runtime name of agentvm's shim v2.
pub const SHIM_RUNTIME: &str = "io.containerd.agentvm.v2";

/// The shared fixture: containerd is up and the rootfs is unpacked.
pub fn containerd() -> Result<&'static Containerd, String> {
    static CONTAINERD: OnceLock<Result<Containerd, String>> = OnceLock::new();
    CONTAINERD
        .get_or_init(|| {
            if let Some(why) = host_unsuitable(&["containerd", "ctr", "containerd-shim-runc-v2"]) {
                return Err(why);
            }
            Ok(Containerd::started(Instance {
                name: "containerd",
                path_first: None,
                cri: None,
            }))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The containerd for `ctr run --runtime io.containerd.agentvm.v2`: the
/// shim binary of this build (see [`super::shim_bin`]) first in `PATH`.
pub fn containerd_for_shim() -> Result<&'static Containerd, String> {
    static CONTAINERD: OnceLock<Result<Containerd, String>> = OnceLock::new();
    CONTAINERD
        .get_or_init(|| {
            if let Some(why) = host_unsuitable(&["containerd", "ctr"]) {
                return Err(why);
            }
            Ok(Containerd::started(Instance {
                name: "containerd-shim",
                path_first: Some(super::built_shim_dir()),
                cri: None,
            }))
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl Containerd {
    /// The daemon of `instance`, started if it does not run.
    fn started(instance: Instance) -> Containerd {
        ensure_daemon(&instance);
        Containerd {
            runtime: Runtime::from_env(),
            rootfs: rootfs::unpacked(),
            instance,
        }
    }
}

impl Instance {
    pub(crate) fn dir(&self) -> PathBuf {
        Path::new(RUN_DIR).join(self.name)
    }

    pub(crate) fn socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    fn log_path(&self) -> PathBuf {
        Path::new(RUN_DIR).join(format!("{}.log", self.name))
    }

    fn config(&self) -> String {
        // The PATH is in the config as a comment, so that another one
        // restarts the daemon as a changed config does.
        let path_note = match &self.path_first {
            Some(p) => format!("# PATH starts with {}\n", p.display()),
            None => String::new(),
        };
        let (disabled, cri) = match &self.cri {
            Some(cri) => ("", cri.as_str()),
            None => ("disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n", ""),
        };
        format!(
            "{path_note}version = 2\n\
             root = \"{}\"\n\
             state = \"{}\"\n\
             {disabled}\
             \n\
             [grpc]\n  address = \"{}\"\n{cri}",
            Path::new(DATA_DIR).join(self.name).display(),
            self.dir().join("state").display(),
            self.socket().display(),
        )
    }

    pub(crate) fn ctr(&self) -> Command {
        self.ctr_in(NAMESPACE)
    }

    /// `ctr` in containerd namespace `namespace` (CRI's is `k8s.io`).
    pub(crate) fn ctr_in(&self, namespace: &str) -> Command {
        let mut c = Command::new("ctr");
        c.arg("--address")
            .arg(self.socket())
            .args(["--namespace", namespace]);
        c
    }

    fn answers(&self) -> bool {
        cmd::try_run_with(
            self.ctr().arg("version"),
            None,
            std::time::Duration::from_secs(10),
        )
        .map(|o| o.success())
        .unwrap_or(false)
    }
}

pub(crate) fn ensure_daemon(instance: &Instance) {
    std::fs::create_dir_all(instance.dir()).expect("create containerd dir");
    let _lock = daemon::lock(&Path::new(RUN_DIR).join(format!("{}.lock", instance.name)));
    let config_path = Path::new(RUN_DIR).join(format!("{}.toml", instance.name));
    let changed = daemon::write_if_changed(&config_path, &instance.config());
    let answers = || instance.answers();
    if let Some(pid) = find_containerd_pid(&config_path) {
        if !changed && answers() {
            return;
        }
        // SAFETY: kill only sends a signal, to the live containerd named by
        // our own pid file; it is restarted with the new config below.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        super::wait_for(30, || {
            find_containerd_pid(&config_path).is_none().then_some(())
        });
    }
    let mut command = Command::new("containerd");
    command.arg("--config").arg(&config_path).current_dir("/");
    if let Some(first) = &instance.path_first {
        let mut dirs = vec![first.clone()];
        if let Some(path) = std::env::var_os("PATH") {
            dirs.extend(std::env::split_paths(&path));
        }
        command.env(
            "PATH",
            std::env::join_paths(dirs).expect("PATH entries without ':'"),
        );
    }
    daemon::start(daemon::Spec {
        name: "containerd",
        command,
        log: instance.log_path(),
        ready: &answers,
        ready_timeout_secs: 60,
    });
}

/// The pid of a live containerd started with `config` (containerd writes
/// no pid file of its own).
fn find_containerd_pid(config: &Path) -> Option<i32> {
    let want = config.to_str()?;
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        // A zombie has an empty cmdline and does not match.
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_it = args.first().is_some_and(|a| a.ends_with(b"containerd"))
            && args.contains(&want.as_bytes());
        is_it.then_some(pid)
    })
}

impl Containerd {
    /// `ctr run --rm` of `command` with the runtime under test.
    pub fn run_rm(&self, id: &str, command: &[&str]) -> Output {
        let mut c = self.instance.ctr();
        c.args(["run", "--rm", "--runc-binary"])
            .arg(self.runtime.binary())
            .arg("--runc-root")
            .arg(Path::new(RUN_DIR).join("runc"))
            .args(["--env", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]);
        if self.runtime == Runtime::AgentvmContainer {
            c.arg("--annotation")
                .arg(format!("{ISOLATION_ANNOTATION}=container"));
        }
        c.arg("--rootfs").arg(&self.rootfs).arg(id).args(command);
        cmd::run(&mut c)
    }

    /// `ctr run --rm --runtime io.containerd.agentvm.v2` of `command`, the
    /// tier picked by the OCI annotation (`container` or `microvm`).
    pub fn run_rm_shim(&self, id: &str, tier: &str, command: &[&str]) -> Output {
        self.run_shim("--rm", id, tier, command)
    }

    /// `ctr run -d --runtime io.containerd.agentvm.v2`: the container
    /// `id` runs `command` in the background.
    pub fn run_detached_shim(&self, id: &str, tier: &str, command: &[&str]) -> Output {
        self.run_shim("-d", id, tier, command)
    }

    /// `ctr run MODE --runtime io.containerd.agentvm.v2` on the test rootfs.
    fn run_shim(&self, mode: &str, id: &str, tier: &str, command: &[&str]) -> Output {
        let mut c = self.instance.ctr();
        c.args(["run", mode, "--runtime", SHIM_RUNTIME])
            .args(["--env", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"])
            .arg("--annotation")
            .arg(format!("{ISOLATION_ANNOTATION}={tier}"))
            .arg("--rootfs")
            .arg(&self.rootfs)
            .arg(id)
            .args(command);
        cmd::run(&mut c)
    }

    /// `ctr run MODE --runtime io.containerd.agentvm.v2 OPTIONS` of
    /// `command` in the image [`Containerd::busybox_image`] (`MODE`: `-d`
    /// or `--rm`; `OPTIONS` such as `--memory-limit N`).
    pub fn run_shim_image_with(
        &self,
        mode: &str,
        id: &str,
        tier: &str,
        options: &[&str],
        command: &[&str],
    ) -> Output {
        let image = self.busybox_image();
        let mut c = self.instance.ctr();
        c.args(["run", mode, "--runtime", SHIM_RUNTIME])
            .arg("--annotation")
            .arg(format!("{ISOLATION_ANNOTATION}={tier}"))
            .args(options)
            .arg(image)
            .arg(id)
            .args(command);
        cmd::run(&mut c)
    }

    /// `ctr` against this containerd, not run yet (for a client on a pty,
    /// or one left running such as `ctr events`).
    pub fn ctr_command(&self) -> Command {
        self.instance.ctr()
    }

    /// The bundle containerd made for task `id` (the shim's working
    /// directory; with an image, `rootfs/` is the snapshot mounted).
    pub fn task_bundle(&self, id: &str) -> PathBuf {
        self.instance
            .dir()
            .join("state/io.containerd.runtime.v2.task")
            .join(NAMESPACE)
            .join(id)
    }

    /// The task API's `Update` of task `id` with `resources` (an OCI
    /// `LinuxResources`), sent straight to its shim over ttrpc, packed as
    /// containerd packs it (JSON in an `Any`). containerd 1.6's `ctr` has
    /// no `task update`, and this containerd has no CRI plugin, so no
    /// client of ours can make containerd send it.
    pub fn shim_update(&self, id: &str, resources: &serde_json::Value) -> Result<(), String> {
        use containerd_shim_protos::api::UpdateTaskRequest;
        use containerd_shim_protos::protobuf::well_known_types::any::Any;
        use containerd_shim_protos::protobuf::MessageField;

        let address_file = self.task_bundle(id).join("address");
        let address = std::fs::read_to_string(&address_file)
            .map_err(|e| format!("cannot read {}: {e}", address_file.display()))?;
        let client = containerd_shim_protos::ttrpc::Client::connect(address.trim())
            .map_err(|e| format!("cannot connect to the shim at {}: {e}", address.trim()))?;
        let tasks = containerd_shim_protos::TaskClient::new(client);
        let req = UpdateTaskRequest {
            id: id.to_string(),
            resources: MessageField::some(Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources"
                    .to_string(),
                value: resources.to_string().into_bytes(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let timeout = std::time::Duration::from_secs(60).as_nanos() as i64;
        tasks
            .update(
                containerd_shim_protos::ttrpc::context::with_timeout(timeout),
                &req,
            )
            .map(drop)
            .map_err(|e| format!("update of {id}: {e}"))
    }

    /// `ctr run --rm --runtime io.containerd.agentvm.v2` of `command` in
    /// the image [`Containerd::busybox_image`]: its rootfs comes from the
    /// snapshotter, as mounts the shim mounts on the bundle's rootfs.
    pub fn run_rm_shim_image(&self, id: &str, tier: &str, command: &[&str]) -> Output {
        self.run_rm_shim_image_input(id, tier, None, command)
    }

    /// [`Containerd::run_rm_shim_image`] with `input` on ctr's stdin,
    /// which ctr hands to the container through the stdin FIFO.
    pub fn run_rm_shim_image_input(
        &self,
        id: &str,
        tier: &str,
        input: Option<&[u8]>,
        command: &[&str],
    ) -> Output {
        let image = self.busybox_image();
        let mut c = self.instance.ctr();
        c.args(["run", "--rm", "--runtime", SHIM_RUNTIME])
            .arg("--annotation")
            .arg(format!("{ISOLATION_ANNOTATION}={tier}"))
            .arg(image)
            .arg(id)
            .args(command);
        cmd::run_with(&mut c, input, cmd::DEFAULT_TIMEOUT)
    }

    /// The busybox rootfs tarball imported as the image `local/busybox:latest`
    /// (once): an OCI image layout written here, its one layer the tarball
    /// uncompressed, since no registry is reachable.
    pub fn busybox_image(&self) -> &'static str {
        const IMAGE: &str = "local/busybox:latest";
        static IMPORTED: OnceLock<()> = OnceLock::new();
        IMPORTED.get_or_init(|| {
            let archive = oci_archive(&rootfs::tarball(), "busybox-oci", &["sh"]);
            cmd::run(
                self.instance
                    .ctr()
                    .args(["image", "import", "--base-name", "local/busybox"])
                    .arg(&archive),
            )
            .ok();
        });
        IMAGE
    }

    /// `ctr <args>` against this containerd, in the tests' namespace.
    pub fn ctr(&self, args: &[&str]) -> Output {
        cmd::run(self.instance.ctr().args(args))
    }
}

/// Writes an OCI image archive (a tar of an image layout) whose one layer
/// is `layer` and whose command is `cmd`, under the name `name`, and
/// returns its path.
pub(crate) fn oci_archive(layer: &Path, name: &str, cmd: &[&str]) -> PathBuf {
    let dir = Path::new(DATA_DIR).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("create the image layout");
    let add = |data: &[u8]| -> (String, usize) {
        let tmp = dir.join("blob.tmp");
        std::fs::write(&tmp, data).expect("write a blob");
        let digest = sha256(&tmp);
        std::fs::rename(&tmp, blobs.join(&digest)).expect("store a blob");
        (format!("sha256:{digest}"), data.len())
    };
    let layer_digest = sha256(layer);
    let layer_size = std::fs::metadata(layer).expect("the layer tarball").len();
    std::fs::copy(layer, blobs.join(&layer_digest)).expect("store the layer");
    let layer_digest = format!("sha256:{layer_digest}");
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": cmd},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let (config_digest, config_size) = add(config.to_string().as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": layer_size}],
    });
    let (manifest_digest, manifest_size) = add(manifest.to_string().as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": manifest_digest, "size": manifest_size,
                       "annotations": {"org.opencontainers.image.ref.name": "latest"}}],
    });
    std::fs::write(dir.join("index.json"), index.to_string()).expect("write index.json");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
        .expect("write oci-layout");
    let archive = Path::new(DATA_DIR).join(format!("{name}.tar"));
    cmd::run(
        Command::new("tar")
            .arg("cf")
            .arg(&archive)
            .arg("-C")
            .arg(&dir)
            .arg("."),
    )
    .ok();
    archive
}

/// The hex SHA-256 of a file (coreutils' sha256sum).
fn sha256(path: &Path) -> String {
    let out = cmd::run(Command::new("sha256sum").arg(path)).ok();
    out.stdout
        .split_whitespace()
        .next()
        .expect("sha256sum prints a digest")
        .to_string()
}
