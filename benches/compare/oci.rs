//! Part (a): the OCI lifecycle of `/bin/true` driven directly, as
//! containerd's shim drives a runtime: `create --pid-file`, `start`, wait
//! for the init to exit, `delete`.
//!
//! One busybox bundle is made per run and shared (its rootfs is read-only);
//! each runtime keeps its state under its own `--root`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::rootfs;
use crate::error::BenchError;
use crate::reaper::{children_cpu, reap_orphans, Exit, PidFd};
use crate::runtimes::Runtime;

/// How long `/bin/true` may take before a round is called hung.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where one run keeps its bundle, runtime roots and logs.
pub struct Workspace {
    pub dir: PathBuf,
    pub bundle: PathBuf,
}

/// The time each phase of one round took.
#[derive(Debug, Clone, Default)]
pub struct Phases {
    /// `create --pid-file` until the runtime exited (and the pidfd is open).
    pub create: Duration,
    /// `start` until the runtime exited.
    pub start: Duration,
    /// From `start`'s exit to the init's exit being seen and reaped.
    pub wait: Duration,
    /// `delete` until the runtime exited.
    pub delete: Duration,
    /// Wall clock of the whole round.
    pub total: Duration,
    /// A microVM's boot trace (the supervisor's parts of `create`, from
    /// its `microvm.json`); empty for other runtimes.
    pub boot: Vec<(String, Duration)>,
    /// The VMM's own measure from the VM's creation to the guest's first
    /// instruction (the builtin VMM keeps it); `None` elsewhere.
    pub first_instruction: Option<Duration>,
    /// That span step by step, as the VMM counted it.
    pub first_instruction_steps: Vec<(String, Duration)>,
    /// CPU time (user + system) of every process of the round: the runtime
    /// commands, their helpers and the container's init.
    pub cpu: Duration,
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BenchError {
    let path = path.to_path_buf();
    move |source| BenchError::File { what, path, source }
}

/// Runs a setup command to completion, its output captured.
fn setup(cmd: &mut Command) -> Result<(), BenchError> {
    let command = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| BenchError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(BenchError::Failed {
            command,
            status: out.status,
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}

impl Workspace {
    /// Makes a fresh bundle under `dir`: the busybox rootfs of the tests,
    /// read-only, and `spec_by`'s default `config.json` running `/bin/true`
    /// without a terminal.
    pub fn prepare(dir: &Path, spec_by: &Runtime) -> Result<Workspace, BenchError> {
        let bundle = dir.join("bundle");
        if bundle.exists() {
            std::fs::remove_dir_all(&bundle).map_err(io_err("cannot remove", &bundle))?;
        }
        let rootfs_dir = bundle.join("rootfs");
        std::fs::create_dir_all(&rootfs_dir).map_err(io_err("cannot create", &rootfs_dir))?;
        let tar = rootfs::tarball();
        setup(
            Command::new("tar")
                .arg("--numeric-owner")
                .arg("-xpf")
                .arg(&tar)
                .arg("-C")
                .arg(&rootfs_dir),
        )?;
        setup(
            Command::new(&spec_by.program)
                .arg("spec")
                .current_dir(&bundle),
        )?;
        let config = bundle.join("config.json");
        let text = std::fs::read_to_string(&config).map_err(io_err("cannot read", &config))?;
        let mut spec: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| BenchError::File {
                what: "bad JSON in",
                path: config.clone(),
                source: e.into(),
            })?;
        spec["process"]["args"] = serde_json::json!(["/bin/true"]);
        spec["process"]["terminal"] = serde_json::json!(false);
        spec["root"] = serde_json::json!({ "path": "rootfs", "readonly": true });
        std::fs::write(&config, spec.to_string()).map_err(io_err("cannot write", &config))?;
        Ok(Workspace {
            dir: dir.to_path_buf(),
            bundle,
        })
    }

    /// A second bundle `name` next to the first, sharing its rootfs, whose
    /// process runs `args` instead of `/bin/true`.
    pub fn bundle_running(&self, name: &str, args: &[&str]) -> Result<PathBuf, BenchError> {
        let bundle = self.dir.join(name);
        std::fs::create_dir_all(&bundle).map_err(io_err("cannot create", &bundle))?;
        let config = self.bundle.join("config.json");
        let text = std::fs::read_to_string(&config).map_err(io_err("cannot read", &config))?;
        let mut spec: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| BenchError::File {
                what: "bad JSON in",
                path: config.clone(),
                source: e.into(),
            })?;
        spec["process"]["args"] = serde_json::json!(args);
        let rootfs = self.bundle.join("rootfs").display().to_string();
        spec["root"] = serde_json::json!({ "path": rootfs, "readonly": true });
        let out = bundle.join("config.json");
        std::fs::write(&out, spec.to_string()).map_err(io_err("cannot write", &out))?;
        Ok(bundle)
    }

    /// The state directory (`--root`) of one runtime.
    pub fn root(&self, rt: &Runtime) -> PathBuf {
        self.dir.join(format!("root-{}", rt.docker_name))
    }

    /// Removes containers an interrupted earlier run left in `rt`'s root.
    pub fn clear_root(&self, rt: &Runtime) -> Result<(), BenchError> {
        let root = self.root(rt);
        if !root.exists() {
            return Ok(());
        }
        let listed = rt.command(&root).args(["list", "-q"]).output();
        if let Ok(out) = listed {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = rt
                    .command(&root)
                    .args(["delete", "--force", id])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        reap_orphans();
        std::fs::remove_dir_all(&root).map_err(io_err("cannot remove", &root))
    }
}

/// One runtime command of a round; its stderr (and the container's) goes to
/// `log`, which is shown if it fails.
pub fn invoke(
    rt: &Runtime,
    root: &Path,
    args: &[&std::ffi::OsStr],
    log: &(File, PathBuf),
) -> Result<(), BenchError> {
    let mut cmd = rt.command(root);
    cmd.args(args);
    let command = format!("{cmd:?}");
    let stderr = log.0.try_clone().map_err(io_err("cannot dup", &log.1))?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .status()
        .map_err(|source| BenchError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !status.success() {
        return Err(BenchError::Failed {
            command,
            status,
            output: std::fs::read_to_string(&log.1).unwrap_or_default(),
        });
    }
    Ok(())
}

fn read_pid(path: &Path) -> Result<i32, BenchError> {
    let content = std::fs::read_to_string(path).map_err(io_err("cannot read", path))?;
    content.trim().parse().map_err(|_| BenchError::BadPid {
        path: path.to_path_buf(),
        content,
    })
}

/// One timed round: create, start, wait for the init's exit, delete. On
/// failure the container is force-deleted before the error is returned.
pub fn round(ws: &Workspace, rt: &Runtime, id: &str) -> Result<Phases, BenchError> {
    let root = ws.root(rt);
    let pid_file = ws.dir.join(format!("{id}.pid"));
    let log_path = ws.dir.join(format!("{}.log", rt.docker_name));
    let log = File::create(&log_path).map_err(io_err("cannot create", &log_path))?;
    let log = (log, log_path);
    let result =
        timed_round(ws, rt, &root, id, &pid_file, &log).map_err(|e| {
            match microvm_diagnosis(&root, id) {
                Some(detail) => BenchError::Diagnosed {
                    source: Box::new(e),
                    detail,
                },
                None => e,
            }
        });
    if result.is_err() {
        let _ = rt
            .command(&root)
            .args(["delete", "--force", id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        reap_orphans();
    }
    let _ = std::fs::remove_file(&pid_file);
    result
}

fn timed_round(
    ws: &Workspace,
    rt: &Runtime,
    root: &Path,
    id: &str,
    pid_file: &Path,
    log: &(File, PathBuf),
) -> Result<Phases, BenchError> {
    let id_os = std::ffi::OsStr::new(id);
    let cpu0 = children_cpu();
    let t0 = Instant::now();
    invoke(
        rt,
        root,
        &[
            "create".as_ref(),
            "--bundle".as_ref(),
            ws.bundle.as_os_str(),
            "--pid-file".as_ref(),
            pid_file.as_os_str(),
            id_os,
        ],
        log,
    )?;
    let init = PidFd::open(read_pid(pid_file)?)?;
    let t1 = Instant::now();
    let (boot, first_instruction, first_instruction_steps) = boot_trace(root, id);
    invoke(rt, root, &["start".as_ref(), id_os], log)?;
    let t2 = Instant::now();
    if init.wait_exit(EXIT_TIMEOUT)?.is_none() {
        return Err(BenchError::Hung {
            id: id.to_string(),
            secs: EXIT_TIMEOUT.as_secs(),
        });
    }
    let exit = init.reap()?;
    let t3 = Instant::now();
    invoke(rt, root, &["delete".as_ref(), id_os], log)?;
    let t4 = Instant::now();
    let cpu = children_cpu().saturating_sub(cpu0);
    if exit != Exit::Code(0) {
        return Err(BenchError::Workload {
            id: id.to_string(),
            status: exit.to_string(),
        });
    }
    Ok(Phases {
        create: t1 - t0,
        start: t2 - t1,
        wait: t3 - t2,
        delete: t4 - t3,
        total: t4 - t0,
        cpu,
        boot,
        first_instruction,
        first_instruction_steps,
    })
}

/// The boot trace an agentvm microVM keeps in its state directory, and
/// its VMM's time to the first guest instruction (in all, and by step), if
/// this container is one.
fn boot_trace(root: &Path, id: &str) -> (Parts, Option<Duration>, Parts) {
    let parts = |v: Vec<agentvm::microvm::supervisor::trace::BootPart>| -> Parts {
        v.into_iter()
            .map(|p| (p.part, Duration::from_micros(p.us)))
            .collect()
    };
    match agentvm::microvm::vmstate::VmState::load(&root.join(id)) {
        Ok(state) => (
            parts(state.boot),
            state.first_instruction_us.map(Duration::from_micros),
            parts(state.first_instruction_steps),
        ),
        Err(_) => (Vec::new(), None, Vec::new()),
    }
}

/// What a failed microVM round's VM shows before it is deleted: each
/// thread of its supervisor (the builtin VMM's vCPUs and devices among
/// them) with its state, the kernel function it sleeps in and its system
/// call, and the end of the guest's console. `None` for other runtimes.
fn microvm_diagnosis(root: &Path, id: &str) -> Option<String> {
    let dir = root.join(id);
    let state = agentvm::microvm::vmstate::VmState::load(&dir).ok()?;
    let mut out = String::new();
    if let Some(pid) = state.supervisor_pid {
        out.push_str(&format!("supervisor {pid}, its threads:\n"));
        out.push_str(&crate::common::cmd::threads_of(pid.unsigned_abs()));
    }
    let console =
        std::fs::read(dir.join(agentvm::microvm::vmstate::CONSOLE_LOG)).unwrap_or_default();
    let tail = &console[console.len().saturating_sub(1500)..];
    out.push_str(&format!(
        "guest console, last {} bytes:\n{}",
        tail.len(),
        String::from_utf8_lossy(tail)
    ));
    Some(out)
}

/// Named spans, in order.
type Parts = Vec<(String, Duration)>;
