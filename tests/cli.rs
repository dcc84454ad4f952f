//! The runc-compatible command line, driven directly (no client in between):
//! bad input fails with one line naming the problem and leaves nothing
//! behind; concurrent commands on one id do not interleave; the lifecycle
//! behaves as runc's.

#[allow(dead_code)]
mod common;

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::cmd::Output;

/// A state root, a bundle and a log of their own, removed at the end.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("agentvm-cli-")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir(dir.path().join("root")).expect("root");
        let f = Fixture { dir };
        f.write_config(&["true"], |_| {});
        f
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn bundle(&self) -> PathBuf {
        self.dir.path().join("bundle")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("log.json")
    }

    /// Writes a config.json for `args` on the shared busybox rootfs,
    /// letting `edit` change the JSON first.
    fn write_config(&self, args: &[&str], edit: impl FnOnce(&mut serde_json::Value)) {
        let bundle = self.bundle();
        std::fs::create_dir_all(&bundle).expect("bundle");
        let rootfs = common::rootfs::unpacked();
        let mut config = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": {"uid": 0, "gid": 0},
                "args": args,
                "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
                "cwd": "/",
                "noNewPrivileges": true
            },
            "root": {"path": rootfs, "readonly": true},
            "hostname": "cli-test",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                 "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}
            ],
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"},
                               {"type": "mount"}, {"type": "network"}]
            }
        });
        edit(&mut config);
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&config).expect("json"),
        )
        .expect("write config");
    }

    /// Runs agentvm with stdout and stderr in files, not pipes: a created
    /// container's init inherits them and keeps them open, so a pipe would
    /// not reach EOF until the container ends (with runc as well).
    fn agentvm(&self, args: &[&str]) -> Output {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let out_path = self.dir.path().join(format!("out.{n}"));
        let err_path = self.dir.path().join(format!("err.{n}"));
        let mut cmd = Command::new(common::agentvm_bin());
        cmd.arg("--root")
            .arg(self.root())
            .arg("--log")
            .arg(self.log())
            .arg("--log-format")
            .arg("json")
            .arg("--isolation=container")
            .args(args)
            .stdin(Stdio::null())
            .stdout(File::create(&out_path).expect("stdout file"))
            .stderr(File::create(&err_path).expect("stderr file"));
        let command = common::cmd::describe(&cmd);
        let mut child = cmd.spawn().expect("spawn agentvm");
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break st;
            }
            assert!(Instant::now() < deadline, "`{command}` hung");
            std::thread::sleep(Duration::from_millis(5));
        };
        Output {
            command,
            code: status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
            stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
            stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        }
    }

    fn create(&self, id: &str) -> Output {
        let bundle = self.bundle();
        self.agentvm(&["create", "--bundle", bundle.to_str().expect("utf-8"), id])
    }

    fn state(&self, id: &str) -> serde_json::Value {
        let out = self.agentvm(&["state", id]).ok();
        serde_json::from_str(&out.stdout).expect("state is JSON")
    }

    /// Entries left in the state root (hidden files included).
    fn leftovers(&self) -> Vec<String> {
        std::fs::read_dir(self.root())
            .expect("read root")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }
}

fn skip_unless_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (namespaces, cgroups)");
        return true;
    }
    false
}

/// Every cgroup directory named `id` under any mounted hierarchy.
fn cgroups_named(id: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                // libcontainer names a cgroup without cgroupsPath ":youki:<id>".
                if e.file_name().to_string_lossy().contains(id) {
                    found.push(e.path());
                }
                if dir.components().count() < 8 {
                    stack.push(e.path());
                }
            }
        }
    }
    found
}

/// Processes whose command line mentions `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc")
        .expect("proc")
        .filter_map(|e| e.ok())
    {
        if let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) {
                found.push(format!("{}: {text}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// One failed command: non-zero, one stderr line naming the problem, the
/// same message as a JSON error line in the log.
#[track_caller]
fn assert_one_clear_error(f: &Fixture, out: &Output, needle: &str) {
    assert_ne!(out.code, 0, "expected failure:\n{out}");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one stderr line:\n{out}");
    assert!(
        lines[0].contains(needle),
        "stderr should name {needle:?}:\n{out}"
    );
    let log = std::fs::read_to_string(f.log()).expect("log file written");
    let last = log.lines().last().expect("log has a line");
    let entry: serde_json::Value = serde_json::from_str(last).expect("log line is JSON");
    assert_eq!(entry["level"], "error", "{last}");
    assert!(
        entry["msg"].as_str().unwrap_or("").contains(needle),
        "{last}"
    );
    assert!(entry["time"].is_string(), "{last}");
}

#[track_caller]
fn assert_nothing_left(f: &Fixture, id: &str) {
    assert_eq!(f.leftovers(), Vec::<String>::new(), "state root not empty");
    assert_eq!(cgroups_named(id), Vec::<PathBuf>::new(), "cgroup left");
    assert_eq!(processes_with(id), Vec::<String>::new(), "process left");
}

#[test]
fn bad_bundles_fail_cleanly() {
    if skip_unless_root() {
        return;
    }
    type Edit = fn(&mut serde_json::Value);
    let cases: &[(&str, Edit, &str)] = &[
        (
            "bad-missing-process",
            |c| {
                c.as_object_mut().expect("object").remove("process");
            },
            "\"process\" field is missing",
        ),
        (
            "bad-empty-args",
            |c| c["process"]["args"] = serde_json::json!([]),
            "process.args must not be empty",
        ),
        (
            "bad-no-rootfs",
            |c| c["root"]["path"] = "/nonexistent/rootfs".into(),
            "rootfs /nonexistent/rootfs does not exist",
        ),
        (
            "bad-version",
            |c| c["ociVersion"] = "0.1.0".into(),
            "unsupported ociVersion",
        ),
        (
            "bad-no-binary",
            |c| c["process"]["args"] = serde_json::json!(["/no/such/binary"]),
            "/no/such/binary",
        ),
    ];
    for (id, edit, needle) in cases {
        let f = Fixture::new();
        f.write_config(&["true"], edit);
        let out = f.create(id);
        assert_one_clear_error(&f, &out, needle);
        assert_nothing_left(&f, id);
    }
}

#[test]
fn config_that_is_not_json() {
    if skip_unless_root() {
        return;
    }
    let f = Fixture::new();
    std::fs::write(f.bundle().join("config.json"), "{ not json").expect("write");
    let out = f.create("bad-json");
    assert_one_clear_error(&f, &out, "is not valid JSON");
    assert_nothing_left(&f, "bad-json");
}

#[test]
fn bundle_that_is_not_a_directory() {
    if skip_unless_root() {
        return;
    }
    let f = Fixture::new();
    let file = f.dir.path().join("a-file");
    std::fs::write(&file, "").expect("write");
    let out = f.agentvm(&[
        "create",
        "--bundle",
        file.to_str().expect("utf-8"),
        "bad-bundle",
    ]);
    assert_one_clear_error(&f, &out, "is not a directory");
    let out = f.agentvm(&["create", "--bundle", "/no/such/bundle", "bad-bundle"]);
    assert_one_clear_error(&f, &out, "does not exist");
    assert_nothing_left(&f, "bad-bundle");
}

#[test]
fn ids_that_are_paths_are_refused() {
    if skip_unless_root() {
        return;
    }
    let f = Fixture::new();
    for id in ["a/b", "..", "../escape", "with space", ""] {
        let out = f.create(id);
        assert_one_clear_error(&f, &out, "invalid container id");
        assert_nothing_left(&f, "escape");
    }
    assert!(!f.dir.path().join("escape").exists());
}

#[test]
fn duplicate_id_is_refused_and_the_first_survives() {
    if skip_unless_root() {
        return;
    }
    let f = Fixture::new();
    f.write_config(&["sleep", "60"], |_| {});
    let id = common::unique_name("dup");
    f.create(&id).ok();
    let out = f.create(&id);
    assert_one_clear_error(&f, &out, "already exists");
    assert_eq!(f.state(&id)["status"], "created");
    f.agentvm(&["delete", "--force", &id]).ok();
    assert_nothing_left(&f, &id);
}

#[test]
fn unknown_id_for_every_command() {
    if skip_unless_root() {
        return;
    }
    let f = Fixture::new();
    for args in [
        vec!["state", "nope"],
        vec!["start", "nope"],
        vec!["kill", "nope", "KILL"],
        vec!["delete", "nope"],
        vec!["pause", "nope"],
        vec!["resume", "nope"],
        vec!["ps", "nope"],
        vec!["exec", "nope", "true"],
    ] {
        let out = f.agentvm(&args);
        assert_one_clear_error(&f, &out, "container nope does not exist");
    }
    // runc: delete --force of a missing container succeeds.
    f.agentvm(&["delete", "--force", "nope"]).ok();
    assert_nothing_left(&f, "nope");
}

#[test]
fn unknown_signal_is_refused_and_changes_nothing() {
    if skip_unless_root() {
        return;
    }
    let f = Fixture::new();
    f.write_config(&["sleep", "60"], |_| {});
    let id = common::unique_name("sig");
    f.create(&id).ok();
    f.agentvm(&["start", &id]).ok();
    let out = f.agentvm(&["kill", &id, "SIGBOGUS"]);
    assert_one_clear_error(&f, &out, "unknown signal \"SIGBOGUS\"");
    assert_eq!(f.state(&id)["status"], "running");
    f.agentvm(&["kill", &id, "KILL"]).ok();
    f.agentvm(&["delete", "--force", &id]).ok();
    assert_nothing_left(&f, &id);
}

#[test]
fn concurrent_creates_of_one_id_make_one_container() {
    if skip_unless_root() {
        return;
    }
    let f = Fixture::new();
    f.write_config(&["sleep", "60"], |_| {});
    let id = common::unique_name("race");
    let outs: Vec<Output> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6).map(|_| s.spawn(|| f.create(&id))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let ok = outs.iter().filter(|o| o.success()).count();
    assert_eq!(ok, 1, "exactly one create wins: {outs:#?}");
    for o in outs.iter().filter(|o| !o.success()) {
        assert!(o.stderr.contains("already exists"), "{o}");
    }
    assert_eq!(f.state(&id)["status"], "created");
    // Concurrent deletes: all succeed or report it gone; it is gone after.
    let outs: Vec<Output> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| f.agentvm(&["delete", "--force", &id])))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    assert!(outs.iter().all(|o| o.success()), "{outs:#?}");
    assert_nothing_left(&f, &id);
}

#[test]
fn lifecycle_states_pid_file_and_exit() {
    if skip_unless_root() {
        return;
    }
    let f = Fixture::new();
    // PID 1 of a pid namespace ignores SIGTERM unless it handles it.
    f.write_config(
        &[
            "sh",
            "-c",
            "trap 'exit 0' TERM; while :; do sleep 0.1; done",
        ],
        |_| {},
    );
    let id = common::unique_name("life");
    let pid_file = f.dir.path().join("pid");
    let bundle = f.bundle();
    f.agentvm(&[
        "create",
        "--bundle",
        bundle.to_str().expect("utf-8"),
        "--pid-file",
        pid_file.to_str().expect("utf-8"),
        &id,
    ])
    .ok();
    let st = f.state(&id);
    assert_eq!(st["status"], "created");
    let pid: i64 = std::fs::read_to_string(&pid_file)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    assert_eq!(st["pid"], pid);
    assert_eq!(
        st["bundle"],
        bundle
            .canonicalize()
            .expect("bundle")
            .to_str()
            .expect("utf-8")
    );
    f.agentvm(&["start", &id]).ok();
    assert_eq!(f.state(&id)["status"], "running");
    let out = f.agentvm(&["start", &id]);
    assert_ne!(out.code, 0, "second start must fail:\n{out}");
    let out = f.agentvm(&["delete", &id]);
    assert_one_clear_error(&f, &out, "not stopped");
    f.agentvm(&["pause", &id]).ok();
    assert_eq!(f.state(&id)["status"], "paused");
    f.agentvm(&["resume", &id]).ok();
    assert_eq!(f.state(&id)["status"], "running");
    let list = f.agentvm(&["list", "--format", "json"]).ok();
    assert!(list.stdout.contains(&id), "{list}");
    let ps = f.agentvm(&["ps", "--format", "json", &id]).ok();
    let pids: Vec<i64> = serde_json::from_str(&ps.stdout).expect("ps json");
    assert!(pids.contains(&pid), "{ps}");
    f.agentvm(&["kill", &id, "TERM"]).ok();
    let stopped = common::wait_for(10, || (f.state(&id)["status"] == "stopped").then_some(()));
    assert!(stopped.is_some(), "container did not stop after SIGTERM");
    assert_eq!(f.state(&id)["pid"], 0);
    f.agentvm(&["delete", &id]).ok();
    assert_nothing_left(&f, &id);
}

#[test]
fn run_returns_the_workload_exit_code() {
    if skip_unless_root() {
        return;
    }
    let f = Fixture::new();
    f.write_config(&["sh", "-c", "echo out; echo err >&2; exit 42"], |_| {});
    let id = common::unique_name("run");
    let bundle = f.bundle();
    let out = f.agentvm(&["run", "--bundle", bundle.to_str().expect("utf-8"), &id]);
    assert_eq!(out.code, 42, "{out}");
    assert_eq!(out.stdout.trim(), "out");
    assert!(out.stderr.contains("err"), "{out}");
    assert_nothing_left(&f, &id);
}

#[test]
fn spec_writes_a_runnable_config_like_runc() {
    if skip_unless_root() {
        return;
    }
    let f = Fixture::new();
    let dir = f.dir.path().join("spec");
    std::fs::create_dir(&dir).expect("dir");
    f.agentvm(&["spec", "--bundle", dir.to_str().expect("utf-8")])
        .ok();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("config"))
            .expect("json");
    assert_eq!(config["process"]["terminal"], true);
    assert_eq!(config["root"]["path"], "rootfs");
    let out = f.agentvm(&["spec", "--bundle", dir.to_str().expect("utf-8")]);
    assert_one_clear_error(&f, &out, "exists");
}
