//! The runc-compatible command line, driven directly (no client in between):
//! bad input fails with one line naming the problem and leaves nothing
//! behind; concurrent commands on one id do not interleave; the lifecycle
//! behaves as runc's.

use agentvm_test_support as common;

use common::bundle::{assert_nothing_left, assert_one_clear_error, skip_unless_root, Fixture};
use common::cmd::Output;

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
        vec!["checkpoint", "nope"],
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
    // As runc's since 1.1.2 (CVE-2022-29162): no inheritable capabilities,
    // and every device denied unless a rule allows it.
    let caps = &config["process"]["capabilities"];
    assert!(caps["bounding"].as_array().is_some_and(|b| !b.is_empty()));
    assert!(
        caps["inheritable"].as_array().is_none_or(|i| i.is_empty()),
        "{caps}"
    );
    assert_eq!(
        config["linux"]["resources"]["devices"],
        serde_json::json!([{"allow": false, "access": "rwm"}])
    );
    let out = f.agentvm(&["spec", "--bundle", dir.to_str().expect("utf-8")]);
    assert_one_clear_error(&f, &out, "exists");
}

/// With a user namespace, a bind mount whose source its root cannot reach
/// (a directory on the way is the host root's, mode 0700) mounts as under
/// runc 1.1, which opens the source outside the namespace: the workload
/// reads what the source's own modes let it read, a file source included,
/// and the spec's `ro` holds. When a later mount lies below such a mount
/// (it would end up hidden), create refuses it with one line naming the
/// mount and the directory, and leaves nothing.
#[test]
fn a_bind_source_the_user_namespace_cannot_reach_is_mounted_from_outside() {
    if skip_unless_root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let with_userns = |mounts: Vec<serde_json::Value>| {
        move |c: &mut serde_json::Value| {
            c["linux"]["namespaces"]
                .as_array_mut()
                .expect("namespaces")
                .push(serde_json::json!({"type": "user"}));
            let map = serde_json::json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
            c["linux"]["uidMappings"] = map.clone();
            c["linux"]["gidMappings"] = map;
            c["mounts"]
                .as_array_mut()
                .expect("mounts")
                .extend(mounts.iter().cloned());
        }
    };
    let f = Fixture::new();
    // A directory of the host root's, mode 0700, on the way.
    let private = f.dir.path().join("private");
    std::fs::create_dir(&private).expect("mkdir");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let hidden = private.join("hidden");
    std::fs::create_dir(&hidden).expect("mkdir");
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(hidden.join("f"), "reached\n").expect("write");
    std::fs::set_permissions(hidden.join("f"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    // Only the host's root may read this one, in the container too.
    std::fs::write(hidden.join("closed"), "secret\n").expect("write");
    std::fs::set_permissions(
        hidden.join("closed"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod");
    let file = private.join("one-file");
    std::fs::write(&file, "a file\n").expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let dir_mount = serde_json::json!({
        "destination": "/home", "type": "bind",
        "source": hidden.to_str().expect("utf-8"), "options": ["rbind", "ro"]
    });
    let file_mount = serde_json::json!({
        "destination": "/dev/motd", "type": "bind",
        "source": file.to_str().expect("utf-8"), "options": ["bind"]
    });
    f.write_config(
        &[
            "sh",
            "-c",
            "cat /home/f /dev/motd; cat /home/closed || echo closed refused; \
             touch /home/new || echo ro refused",
        ],
        with_userns(vec![dir_mount.clone(), file_mount]),
    );
    let bundle = f.bundle();
    let id = common::unique_name("userns-bind");
    let out = f.agentvm(&["run", "--bundle", bundle.to_str().expect("utf-8"), &id]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(
        out.stdout, "reached\na file\nclosed refused\nro refused\n",
        "{out}"
    );
    assert!(!hidden.join("new").exists());
    assert_nothing_left(&f, &id);

    // A later mount below it: refused, named, nothing left.
    let below = serde_json::json!({
        "destination": "/home/sub", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]
    });
    f.write_config(&["cat", "/home/f"], with_userns(vec![dir_mount, below]));
    let id = common::unique_name("userns-bind");
    let out = f.create(&id);
    assert_one_clear_error(&f, &out, "cannot search");
    assert!(
        out.stderr
            .contains(&format!("{} at /home", hidden.display())),
        "{out}"
    );
    assert!(out.stderr.contains("host uid 100000"), "{out}");
    assert!(out.stderr.contains("the mount at /home/sub"), "{out}");
    assert_nothing_left(&f, &id);

    let open = tempfile::Builder::new()
        .prefix("agentvm-userns-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(open.path().join("f"), "visible\n").expect("write");
    std::fs::set_permissions(
        open.path().join("f"),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");
    let open_mount = serde_json::json!({
        "destination": "/home", "type": "bind",
        "source": open.path().to_str().expect("utf-8"), "options": ["rbind", "ro"]
    });
    f.write_config(&["cat", "/home/f"], with_userns(vec![open_mount]));
    let out = f.agentvm(&["run", "--bundle", bundle.to_str().expect("utf-8"), &id]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(out.stdout, "visible\n", "{out}");
    assert_nothing_left(&f, &id);
}

/// The shim's OOM watch (`events --oom-since-create`) may start only after
/// a workload over its limit was killed and the container stopped (a
/// loaded host delays the command's start past `start`): it still prints
/// the kill, once, and ends. Without the flag a stopped container is
/// refused, as runc refuses it.
#[test]
fn events_since_create_reports_a_kill_that_already_stopped_the_container() {
    if skip_unless_root() {
        return;
    }
    let f = Fixture::new();
    f.write_config(
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"],
        |c| c["linux"]["resources"] = serde_json::json!({"memory": {"limit": 32 << 20}}),
    );
    let id = common::unique_name("oom-late");
    f.create(&id).ok();
    f.agentvm(&["start", &id]).ok();
    let stopped = common::wait_for(30, || (f.state(&id)["status"] == "stopped").then_some(()));
    assert!(stopped.is_some(), "the container did not stop");
    let out = f.agentvm(&["events", "--oom-since-create", &id]).ok();
    let ooms: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(
        ooms,
        vec![serde_json::json!({"type": "oom", "id": id})],
        "{out}"
    );
    let out = f.agentvm(&["events", &id]);
    assert_one_clear_error(&f, &out, "is not running");
    f.agentvm(&["delete", &id]).ok();
    assert_nothing_left(&f, &id);
}

/// Runs an agentvm command whose container keeps its stdio: pipes, as a
/// shim gives (CRIU dumps pipes; a host file it could not reopen). The
/// command is waited for without reading them to their end; its stderr is
/// read only when it failed (no container holds the pipe then).
fn with_pipes(f: &Fixture, args: &[&str]) -> (i32, String, std::process::Child) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = f
        .command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agentvm");
    let status = child.wait().expect("wait");
    let mut err = String::new();
    if !status.success() {
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
    }
    (status.code().unwrap_or(-1), err, child)
}

/// `checkpoint`, then `restore`, bring the workload back where it was: its
/// counter goes on from the value it had (a fresh start would count from
/// 1), with its bind mount, in its cgroup; the restored container is then
/// like any other (state, exec, kill, delete), and what restore refuses
/// leaves nothing behind. Compared with runc in the conformance case
/// `checkpoint`.
#[test]
fn checkpoint_and_restore_bring_the_workload_back() {
    if skip_unless_root() {
        return;
    }
    if let Err(why) = common::criu_works() {
        println!("skipped: {why}");
        return;
    }
    let f = Fixture::new();
    let shared = f.dir.path().join("shared");
    std::fs::create_dir(&shared).expect("shared dir");
    f.write_config(
        &[
            "sh",
            "-c",
            "i=0; while :; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done",
        ],
        |c| {
            c["mounts"]
                .as_array_mut()
                .expect("mounts")
                .push(serde_json::json!({
                    "destination": "/tmp", "type": "bind",
                    "source": shared, "options": ["rbind", "rw"]
                }))
        },
    );
    let counter = || -> u64 {
        std::fs::read_to_string(shared.join("n"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let id = common::unique_name("cr");
    let bundle = f.bundle();
    let bundle = bundle.to_str().expect("utf-8");
    let (code, err, _pipes) = with_pipes(&f, &["run", "-d", "--bundle", bundle, &id]);
    assert_eq!(code, 0, "run -d: {err}");
    assert!(
        common::wait_for(20, || (counter() >= 10).then_some(())).is_some(),
        "the workload did not count"
    );
    let images = f.dir.path().join("images");
    let images = images.to_str().expect("utf-8");
    f.agentvm(&["checkpoint", "--image-path", images, &id]).ok();
    assert!(
        f.leftovers().is_empty(),
        "checkpoint left {:?}",
        f.leftovers()
    );
    let saved = counter();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(counter(), saved, "the workload ran on after its checkpoint");

    let restore = [
        "restore",
        "-d",
        "--image-path",
        images,
        "--bundle",
        bundle,
        &id,
    ];
    let (code, err, _pipes2) = with_pipes(&f, &restore);
    assert_eq!(code, 0, "restore: {err}");
    let st = f.state(&id);
    assert_eq!(st["status"], "running", "{st}");
    let pid = st["pid"].as_i64().expect("pid");
    let first = common::wait_for(10, || {
        let n = counter();
        (n != saved).then_some(n)
    })
    .expect("the restored workload does not count");
    assert!(
        first > saved,
        "the restored workload counts from {first}, not on from {saved}"
    );
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    assert!(cgroup.contains(&id), "not in its cgroup:\n{cgroup}");
    let ps = f.agentvm(&["exec", &id, "cat", "/proc/1/cmdline"]).ok();
    assert!(ps.stdout.starts_with("sh\0-c"), "{ps}");

    // A second restore of the running id, and one from nowhere, are refused.
    let out = f.agentvm(&restore);
    assert_one_clear_error(&f, &out, "already exists");
    let other = common::unique_name("cr-none");
    let missing = f.dir.path().join("no-images");
    let out = f.agentvm(&[
        "restore",
        "-d",
        "--image-path",
        missing.to_str().expect("utf-8"),
        "--bundle",
        bundle,
        &other,
    ]);
    assert_one_clear_error(&f, &out, "cannot open the image directory");
    assert!(!f.root().join(&other).exists());

    f.agentvm(&["kill", &id, "KILL"]).ok();
    let stopped = common::wait_for(10, || (f.state(&id)["status"] == "stopped").then_some(()));
    assert!(stopped.is_some(), "the restored container did not stop");
    f.agentvm(&["delete", &id]).ok();
    assert_nothing_left(&f, &id);
    assert_nothing_left(&f, &other);
}
