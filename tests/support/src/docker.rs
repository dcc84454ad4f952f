//! A dedicated dockerd for the tests, and helpers to drive containers.
//!
//! The daemon has its own config file, data root, exec root (and so its own
//! managed containerd), pid file and socket, its own bridge (`avmtest0`) and
//! cgroup parent, and does not touch iptables, so it coexists with a user's
//! Docker. Published ports go through docker-proxy, as they do for
//! 127.0.0.1 with any Docker.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::cgroup::{self, Resource};
use super::cmd::{self, Output};
use super::pty::PtySession;
use super::{agentvm_bin, Runtime, DATA_DIR, RUN_DIR};
use super::{daemon, find_in_path, host_unsuitable, rootfs, unique_name, wait_for};

pub const SOCKET: &str = "/run/agentvm-test/docker.sock";
/// The bridge the test daemon attaches containers to.
pub const BRIDGE: &str = "avmtest0";
/// The bridge's address; containers get addresses in this /24.
const BRIDGE_CIDR: &str = "172.30.213.1/24";
/// Label recording which rootfs tarball the image was imported from.
const ROOTFS_LABEL: &str = "io.agentvm.test.rootfs";

/// The test daemon and the runtime the tests ask it for.
pub struct Docker {
    pub runtime: Runtime,
}

/// The shared fixture: the daemon is up and `local/busybox` exists.
/// `Err` means the tests cannot run on this host (they print `skipped`).
pub fn docker() -> Result<&'static Docker, String> {
    static DOCKER: OnceLock<Result<Docker, String>> = OnceLock::new();
    DOCKER
        .get_or_init(|| {
            if let Some(why) = host_unsuitable(&["dockerd", "docker", "ip"]) {
                return Err(why);
            }
            let docker = Docker {
                runtime: Runtime::from_env(),
            };
            docker.ensure_daemon();
            docker.ensure_image();
            Ok(docker)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The test daemon with containers run by `runtime` instead of the one
/// `AGENTVM_TEST_RUNTIME` names.
pub fn docker_with(runtime: Runtime) -> Result<Docker, String> {
    docker()?;
    Ok(Docker { runtime })
}

fn run_dir() -> &'static Path {
    Path::new(RUN_DIR)
}

fn log_path() -> PathBuf {
    run_dir().join("dockerd.log")
}

/// The agentvm config file the `agentvm` runtime (microvm, the default
/// tier) gets: the kernel kernels/build.sh built, when there is one.
fn microvm_config() -> String {
    microvm_config_with("agentvm-microvm.toml", "")
}

/// The same with `extra` lines under `[microvm]`, as file `name`.
fn microvm_config_with(name: &str, extra: &str) -> String {
    let path = run_dir().join(name);
    let mut text = format!("[microvm]\nvirtiofsd = {:?}\n", super::guest::VIRTIOFSD);
    if let Ok(kernel) = super::guest::kernel() {
        text += &format!("kernel = {:?}\n", kernel.display().to_string());
    }
    text += extra;
    std::fs::create_dir_all(run_dir()).expect("create run dir");
    daemon::write_if_changed(&path, &text);
    path.display().to_string()
}

/// The state root (`--root`) the runtimes get: Docker 20.10's runc shim
/// passes `runtime-runc/moby` below the exec root whichever runtime it
/// runs.
pub fn runtime_root() -> PathBuf {
    run_dir().join("docker-exec/runtime-runc/moby")
}

/// The config file of the `agentvm-pool` runtime (a warm pool of one VM).
pub fn pool_config() -> String {
    microvm_config_with("agentvm-microvm-pool.toml", "pool = 1\n")
}

/// The path the daemon runs agentvm by: a symlink to the binary of the
/// current test run. dockerd reads its config only at start, so naming
/// each build's own path there would restart the shared daemon whenever a
/// debug and a release run (tests, benchmark) alternate, under the feet
/// of whatever else uses it; the link changes without a restart.
fn stable_agentvm_path() -> PathBuf {
    let link = run_dir().join("bin/agentvm");
    std::fs::create_dir_all(run_dir().join("bin")).expect("create bin dir");
    let target = agentvm_bin();
    if std::fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
        let tmp = run_dir().join(format!("bin/.agentvm.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp).expect("symlink agentvm");
        std::fs::rename(&tmp, &link).expect("replace agentvm link");
    }
    link
}

/// The daemon config: the agentvm runtimes as Docker users register them.
fn daemon_config() -> String {
    let bin = stable_agentvm_path();
    let mut runtimes = serde_json::json!({
        "agentvm-container": { "path": bin, "runtimeArgs": ["--isolation=container"] },
        "agentvm": { "path": bin, "runtimeArgs": ["--config", microvm_config()] },
        // The microvm tier taking booted VMs from a warm pool of one.
        "agentvm-pool": { "path": bin, "runtimeArgs": ["--config", pool_config()] },
        // What an operator registers for sandboxes with no way out.
        "agentvm-offline": {
            "path": bin,
            "runtimeArgs": ["--config", microvm_config(), "--egress", "deny"]
        },
        // Sandboxes that may reach one name only: the alias `web:80`.
        "agentvm-only-web": {
            "path": bin,
            "runtimeArgs": ["--config", microvm_config(), "--egress", "web:80"]
        },
        // The same two in the container tier.
        "agentvm-container-offline": {
            "path": bin,
            "runtimeArgs": ["--isolation=container", "--egress", "deny"]
        },
        "agentvm-container-only-web": {
            "path": bin,
            "runtimeArgs": ["--isolation=container", "--egress", "web:80"]
        },
    });
    if let Some(crun) = find_in_path("crun") {
        runtimes["crun"] = serde_json::json!({ "path": crun });
    }
    // Any other peer asked for by AGENTVM_TEST_RUNTIME (runc is built in).
    if let Runtime::Peer(name) = Runtime::from_env() {
        if name != "runc" {
            runtimes[name.as_str()] =
                serde_json::json!({ "path": Runtime::Peer(name.clone()).binary() });
        }
    }
    let config = serde_json::json!({
        "runtimes": runtimes,
        "bridge": BRIDGE,
        "iptables": false,
        "ip-masq": false,
        "cgroup-parent": "agentvm-test",
        "storage-driver": "overlay2",
    });
    serde_json::to_string_pretty(&config).expect("serialize daemon config") + "\n"
}

impl Docker {
    /// A `docker` client command aimed at the test daemon.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new("docker");
        c.env("DOCKER_HOST", format!("unix://{SOCKET}"))
            .env("DOCKER_CONFIG", run_dir().join("docker-cli"));
        c
    }

    /// Runs `docker ARGS`.
    pub fn run(&self, args: &[&str]) -> Output {
        cmd::run(self.cmd().args(args))
    }

    /// Whether the daemon answers; a slow answer is "not yet", not a
    /// failure (the callers poll).
    fn answers(&self) -> bool {
        cmd::try_run_with(
            self.cmd()
                .args(["version", "--format", "{{.Server.Version}}"]),
            None,
            Duration::from_secs(10),
        )
        .is_ok_and(|out| out.success())
    }

    fn ensure_bridge(&self) {
        if cmd::run(Command::new("ip").args(["link", "show", BRIDGE])).success() {
            return;
        }
        cmd::run(Command::new("ip").args(["link", "add", BRIDGE, "type", "bridge"])).ok();
        cmd::run(Command::new("ip").args(["addr", "add", BRIDGE_CIDR, "dev", BRIDGE])).ok();
        cmd::run(Command::new("ip").args(["link", "set", BRIDGE, "up"])).ok();
    }

    fn ensure_daemon(&self) {
        std::fs::create_dir_all(run_dir()).expect("create run dir");
        let _lock = daemon::lock(&run_dir().join("docker.lock"));
        let config_path = run_dir().join("daemon.json");
        let changed = daemon::write_if_changed(&config_path, &daemon_config());
        let pid_file = run_dir().join("docker.pid");
        if let Some(pid) = daemon::running_pid(&pid_file, "dockerd") {
            if !changed && wait_for(30, || self.answers().then_some(())).is_some() {
                return;
            }
            // New config (e.g. the agentvm binary of another checkout), or
            // a daemon that does not answer: restart it. SIGHUP would
            // reload only some settings.
            daemon::stop(pid, "dockerd", &log_path());
        }
        self.ensure_bridge();
        let mut command = Command::new("dockerd");
        command
            .arg("--config-file")
            .arg(&config_path)
            .arg("--data-root")
            .arg(Path::new(DATA_DIR).join("docker"))
            .arg("--exec-root")
            .arg(run_dir().join("docker-exec"))
            .arg("--pidfile")
            .arg(&pid_file)
            .arg("-H")
            .arg(format!("unix://{SOCKET}"));
        daemon::start(daemon::Spec {
            name: "dockerd",
            command,
            log: log_path(),
            ready: &|| self.answers(),
            ready_timeout_secs: 60,
        });
    }

    fn ensure_image(&self) {
        let tar = rootfs::tarball();
        let stamp = format!(
            "{:?}",
            std::fs::metadata(&tar)
                .and_then(|m| m.modified())
                .expect("stat rootfs tarball")
        );
        let _lock = daemon::lock(&run_dir().join("docker-image.lock"));
        let label = format!("{{{{index .Config.Labels \"{ROOTFS_LABEL}\"}}}}");
        let current = self.run(&["image", "inspect", "--format", &label, rootfs::IMAGE]);
        if current.success() && current.out() == stamp {
            return;
        }
        let change = format!("LABEL {ROOTFS_LABEL}=\"{stamp}\"");
        let tar = tar.to_str().expect("utf-8 path");
        self.run(&["import", "--change", &change, tar, rootfs::IMAGE])
            .ok();
    }

    /// `docker run --rm --runtime RT OPTS IMAGE CMD...`, in the foreground.
    pub fn run_rm(&self, opts: &[&str], command: &[&str]) -> Output {
        let mut args = vec!["run", "--rm", "--runtime", self.runtime.docker_name()];
        args.extend_from_slice(opts);
        args.push(rootfs::IMAGE);
        args.extend_from_slice(command);
        self.run(&args)
    }

    /// Starts a detached container (`docker run -d`), removed on drop.
    pub fn start(&self, test: &str, opts: &[&str], command: &[&str]) -> Container<'_> {
        let name = unique_name(test);
        let mut args = vec![
            "run",
            "-d",
            "--name",
            &name,
            "--runtime",
            self.runtime.docker_name(),
        ];
        args.extend_from_slice(opts);
        args.push(rootfs::IMAGE);
        args.extend_from_slice(command);
        let container = Container {
            docker: self,
            name: name.clone(),
        };
        self.run(&args).ok();
        container
    }

    /// `docker run -it --rm ... sh` (or `exec -it`) on a 40x100 pty,
    /// waiting for the shell prompt.
    pub fn interactive(&self, args: &[&str]) -> PtySession {
        let mut cmd = self.cmd();
        cmd.args(args);
        let mut session = PtySession::spawn(cmd, 40, 100);
        session.expect("# ", 60);
        session
    }

    /// The default bridge's gateway address.
    pub fn bridge_gateway(&self) -> String {
        let out = self
            .run(&[
                "network",
                "inspect",
                "bridge",
                "--format",
                "{{range .IPAM.Config}}{{.Gateway}}{{end}}",
            ])
            .ok();
        out.out().to_string()
    }
}

/// A container of the test daemon; `docker rm -f` on drop.
pub struct Container<'a> {
    pub docker: &'a Docker,
    pub name: String,
}

impl Container<'_> {
    /// `docker exec [OPTS] NAME CMD...`
    pub fn exec(&self, opts: &[&str], command: &[&str]) -> Output {
        let mut args = vec!["exec"];
        args.extend_from_slice(opts);
        args.push(&self.name);
        args.extend_from_slice(command);
        self.docker.run(&args)
    }

    /// `docker inspect --format FORMAT NAME`, trimmed.
    pub fn inspect(&self, format: &str) -> String {
        self.docker
            .run(&["inspect", "--format", format, &self.name])
            .ok()
            .out()
            .to_string()
    }

    /// The host pid of the container's process (the runtime's init pid).
    pub fn pid(&self) -> i32 {
        let pid = self.inspect("{{.State.Pid}}");
        pid.parse()
            .unwrap_or_else(|_| panic!("bad pid {pid:?} for {}", self.name))
    }

    /// Waits until `docker logs` shows `marker` (the workload is ready).
    #[track_caller]
    pub fn wait_for_log(&self, marker: &str) {
        let seen = wait_for(30, || {
            let out = self.docker.run(&["logs", &self.name]);
            (out.stdout.contains(marker) || out.stderr.contains(marker)).then_some(())
        });
        if seen.is_none() {
            let logs = self.docker.run(&["logs", &self.name]);
            let state = self
                .docker
                .run(&["inspect", "--format", "{{json .State}}", &self.name]);
            panic!(
                "{marker:?} never appeared in the logs of {}\n{logs}\n{state}",
                self.name
            );
        }
    }

    /// `docker wait`: the container's exit code.
    pub fn wait_exit(&self) -> i32 {
        let out = self.docker.run(&["wait", &self.name]).ok();
        out.out()
            .parse()
            .unwrap_or_else(|_| panic!("bad exit code from docker wait:\n{out}"))
    }

    /// Reads one of the container's cgroup resources from the host.
    pub fn cgroup(&self, resource: Resource) -> String {
        let pid = self.pid();
        cgroup::read_resource(pid, resource).unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }
}

impl Container<'_> {
    /// The host directory of the container's cgroup for `controller`.
    pub fn cgroup_dir(&self, controller: &str) -> PathBuf {
        cgroup::dir(self.pid(), controller)
            .unwrap_or_else(|| panic!("{}: no {controller} cgroup", self.name))
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let mut rm = self.docker.cmd();
        rm.args(["rm", "-f", &self.name]);
        if let Err(e) = cmd::try_run_with(&mut rm, None, Duration::from_secs(60)) {
            eprintln!("cleanup of {} failed: {e}", self.name);
        }
    }
}
