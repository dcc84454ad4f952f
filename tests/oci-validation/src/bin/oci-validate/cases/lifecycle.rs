//! The lifecycle seen from outside: create, start, state, kill, delete, list,
//! ps, pause/resume, exit codes and the errors the spec requires.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use serde_json::{json, Value};

use super::cgroups::host_mount;
use super::{wait_file, CaseFn, Ctx};
use crate::bundle::Bundle;

pub const CASES: &[(&str, CaseFn)] = &[
    ("lifecycle", lifecycle),
    ("lifecycle-signals", signals),
    ("lifecycle-kill-created", kill_created),
    ("lifecycle-delete-force", delete_force),
    ("lifecycle-duplicate-id", duplicate_id),
    ("lifecycle-errors", errors),
    ("exit-codes", exit_codes),
    ("pause-resume", pause_resume),
];

/// A bundle whose /out is a host scratch directory; returns it and the dir.
pub fn bundle_with_out(ctx: &mut Ctx) -> Result<(Bundle, std::path::PathBuf)> {
    let out = ctx.scratch("out")?;
    let mut b = ctx.bundle()?;
    b.push(
        "/mounts",
        json!({"destination": "/out", "type": "bind",
               "source": out.to_string_lossy(), "options": ["rbind", "rw"]}),
    );
    Ok((b, out))
}

fn create(ctx: &mut Ctx, b: &Bundle, id: &str, extra: &[&str]) -> Result<crate::runtime::Output> {
    b.write()?;
    let dir = b.dir_str();
    let mut args = vec!["create", "--bundle", dir.as_str()];
    args.extend_from_slice(extra);
    args.push(id);
    ctx.rt.run(&args)
}

/// Waits up to 10 s for `/proc/PID` to disappear (or become a zombie).
fn wait_gone(pid: i64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"));
        let gone = match &status {
            Err(_) => true,
            Ok(s) => s
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z')),
        };
        if gone {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        crate::reaper::tick(Duration::from_millis(10));
    }
}

fn check_created_state(ctx: &mut Ctx, st: &Value, id: &str, b: &Bundle, pidfile: &Path) {
    ctx.check(
        "state after create: created",
        st["status"] == "created",
        || format!("status {}", st["status"]),
    );
    ctx.check("state id", st["id"] == id, || format!("id {}", st["id"]));
    let bundle = std::fs::canonicalize(&b.dir).unwrap_or_else(|_| b.dir.clone());
    ctx.check(
        "state bundle is the absolute bundle path",
        st["bundle"].as_str().map(Path::new) == Some(bundle.as_path()),
        || format!("bundle {}", st["bundle"]),
    );
    ctx.check(
        "state ociVersion",
        st["ociVersion"].as_str().is_some_and(|v| !v.is_empty()),
        || format!("ociVersion {}", st["ociVersion"]),
    );
    ctx.check(
        "state annotations",
        st["annotations"]["org.oci-validate.case"] == "lifecycle",
        || format!("annotations {}", st["annotations"]),
    );
    let pid = st["pid"].as_i64().unwrap_or(0);
    ctx.check(
        "state pid is a live process",
        pid > 0 && Path::new(&format!("/proc/{pid}")).exists(),
        || format!("pid {}", st["pid"]),
    );
    let written = std::fs::read_to_string(pidfile).unwrap_or_default();
    ctx.check(
        "pid file holds the init pid",
        written.trim().parse::<i64>().ok() == Some(pid),
        || format!("pid file {written:?}, state pid {pid}"),
    );
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let host = ctx.env.host_ns.get("pid").map(std::path::PathBuf::from);
    ctx.check(
        "init in a new pid namespace",
        ns.is_some() && ns != host,
        || format!("init pid ns {ns:?}, host {host:?}"),
    );
}

fn list_checks(ctx: &mut Ctx, id: &str, pid: i64) -> Result<()> {
    let out = ctx.rt.run(&["list"])?;
    ctx.check(
        "list shows the container as running",
        out.success()
            && out
                .stdout
                .lines()
                .any(|l| l.starts_with(id) && l.contains("running")),
        || format!("{}: {}", out.describe(), out.stdout),
    );
    let out = ctx.rt.run(&["list", "--format", "json"])?;
    let parsed: Option<Value> = serde_json::from_str(&out.stdout).ok();
    let entry = parsed
        .as_ref()
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|c| c["id"] == id).cloned());
    ctx.check(
        "list --format json: id, pid, status",
        entry
            .as_ref()
            .is_some_and(|c| c["status"] == "running" && c["pid"].as_i64() == Some(pid)),
        || format!("{}: {}", out.describe(), out.stdout),
    );
    // runc's `list` names the owner of the container's state directory
    // (the harness runs as root); `state` leaves it empty.
    ctx.check(
        "list --format json: owner root",
        entry.as_ref().is_some_and(|c| c["owner"] == "root"),
        || format!("{}: {}", out.describe(), out.stdout),
    );
    let st = ctx.state(id);
    ctx.check(
        "state: owner empty",
        st.as_ref().is_ok_and(|s| s["owner"] == ""),
        || super::show(&st),
    );
    let out = ctx.rt.run(&["ps", "--format", "json", id])?;
    let pids: Vec<i64> = serde_json::from_str(&out.stdout).unwrap_or_default();
    ctx.check(
        "ps --format json lists the init pid",
        pids.contains(&pid),
        || format!("{}: {}", out.describe(), out.stdout),
    );
    Ok(())
}

fn lifecycle(ctx: &mut Ctx) -> Result<()> {
    let (mut b, out) = bundle_with_out(ctx)?;
    b.args(&[
        "/bin/sh",
        "-c",
        "trap 'echo USR1 > /out/signal; exit 0' USR1; echo started > /out/started; \
         while true; do sleep 0.05; done",
    ]);
    b.set(
        "/annotations",
        json!({"org.oci-validate.case": "lifecycle"}),
    );
    let id = ctx.id();
    let pidfile = out.join("pidfile");
    let res = create(ctx, &b, &id, &["--pid-file", &pidfile.to_string_lossy()])?;
    if !ctx.check_ok("create succeeds", &res) {
        bail!("create failed: {}", res.describe());
    }
    let st = ctx
        .state(&id)
        .map_err(anyhow::Error::msg)
        .context("state")?;
    check_created_state(ctx, &st, &id, &b, &pidfile);
    let pid = st["pid"].as_i64().unwrap_or(0);
    ctx.check(
        "workload not started before start",
        !out.join("started").exists(),
        || "the workload ran before start".into(),
    );
    let res = ctx.rt.run(&["start", &id])?;
    ctx.check_ok("start succeeds", &res);
    let started = wait_file(&out.join("started"));
    ctx.check("workload runs after start", started.is_some(), || {
        "no output from the workload".into()
    });
    let st = ctx.wait_status(&id, "running");
    ctx.check("state after start: running", st.is_ok(), || {
        super::show(&st)
    });
    let res = ctx.rt.run(&["start", &id])?;
    ctx.check_refused("second start refused", &res);
    let res = ctx.rt.run(&["delete", &id])?;
    ctx.check_refused("delete of a running container refused", &res);
    let st = ctx.state(&id);
    ctx.check(
        "refused delete leaves it running",
        st.as_ref().is_ok_and(|s| s["status"] == "running"),
        || super::show(&st),
    );
    list_checks(ctx, &id, pid)?;
    let res = ctx.rt.run(&["kill", &id, "USR1"])?;
    ctx.check_ok("kill USR1 succeeds", &res);
    let sig = wait_file(&out.join("signal"));
    ctx.check(
        "signal reaches the init process",
        sig.as_deref().map(str::trim) == Some("USR1"),
        || format!("signal file {sig:?}"),
    );
    let st = ctx.wait_status(&id, "stopped");
    ctx.check("state stopped after init exits", st.is_ok(), || {
        super::show(&st)
    });
    let res = ctx.rt.run(&["ps", &id])?;
    ctx.check(
        "ps of a stopped container: the header alone",
        res.success() && res.stdout.lines().count() == 1 && res.stdout.contains("PID"),
        || format!("{}: {:?}", res.describe(), res.stdout),
    );
    let res = ctx.rt.run(&["ps", "--format", "json", &id])?;
    ctx.check(
        "ps --format json of a stopped container: null",
        res.success() && res.stdout.trim() == "null",
        || format!("{}: {:?}", res.describe(), res.stdout),
    );
    let res = ctx.rt.run(&["kill", &id, "KILL"])?;
    ctx.check_refused("kill of a stopped container refused", &res);
    let res = ctx.rt.run(&["start", &id])?;
    ctx.check_refused("start of a stopped container refused", &res);
    let res = ctx.rt.run(&["delete", &id])?;
    ctx.check_ok("delete of a stopped container succeeds", &res);
    let st = ctx.state(&id);
    ctx.check("state after delete refused", st.is_err(), || {
        super::show(&st)
    });
    let res = ctx.rt.run(&["list", "--format", "json"])?;
    ctx.check(
        "list no longer shows it",
        res.success() && !res.stdout.contains(&format!("\"{id}\"")),
        || format!("{}: {}", res.describe(), res.stdout),
    );
    Ok(())
}

fn signals(ctx: &mut Ctx) -> Result<()> {
    let (mut b, out) = bundle_with_out(ctx)?;
    b.args(&[
        "/bin/sh",
        "-c",
        "trap 'echo TERM >> /out/sig' TERM; trap 'echo HUP >> /out/sig' HUP; \
         trap 'echo USR2 >> /out/sig; exit 3' USR2; echo ready > /out/ready; \
         while true; do sleep 0.05; done",
    ]);
    let id = ctx.id();
    // The runtime runs with SIGHUP, SIGINT and SIGQUIT ignored, as under
    // `nohup` or in a background job of a script: an ignored disposition
    // survives exec, and a shell cannot trap a signal that was ignored when
    // it started, so the HUP step below holds only if the runtime gives its
    // workload default dispositions, as runc does. Set here rather than left
    // to how the suite happens to be started: run under `nohup`, the
    // container tier failed this step every time and passed it otherwise,
    // which looked like a flake.
    b.write()?;
    let dir = b.dir_str();
    let res = ctx.rt.run_ignoring(
        &["create", "--bundle", &dir, &id],
        &[Signal::SIGHUP, Signal::SIGINT, Signal::SIGQUIT],
    )?;
    if !res.success() {
        bail!("create: {}", res.describe());
    }
    let res = ctx.rt.run(&["start", &id])?;
    if !res.success() || wait_file(&out.join("ready")).is_none() {
        bail!("container did not start: {}", res.describe());
    }
    let sig_file = out.join("sig");
    let steps: [(&str, &[&str], &str); 3] = [
        ("kill without a signal sends SIGTERM", &[], "TERM"),
        ("kill with a SIG-prefixed name", &["SIGHUP"], "HUP"),
        ("kill with a signal number", &["12"], "USR2"),
    ];
    for (name, sig, want) in steps {
        let mut args = vec!["kill", id.as_str()];
        args.extend_from_slice(sig);
        let res = ctx.rt.run(&args)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = String::new();
        while Instant::now() < deadline {
            seen = std::fs::read_to_string(&sig_file).unwrap_or_default();
            if seen.lines().any(|l| l == want) {
                break;
            }
            crate::reaper::tick(Duration::from_millis(10));
        }
        ctx.check(
            name,
            res.success() && seen.lines().any(|l| l == want),
            || format!("{}; received {seen:?}", res.describe()),
        );
    }
    let st = ctx.wait_status(&id, "stopped");
    ctx.check(
        "init exiting on a signal stops the container",
        st.is_ok(),
        || super::show(&st),
    );
    Ok(())
}

fn kill_created(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.args(&["/bin/sleep", "600"]);
    let id = ctx.id();
    let res = create(ctx, &b, &id, &[])?;
    if !res.success() {
        bail!("create: {}", res.describe());
    }
    let res = ctx.rt.run(&["kill", &id, "KILL"])?;
    ctx.check_ok("kill of a created container succeeds", &res);
    let st = ctx.wait_status(&id, "stopped");
    ctx.check("killed created container is stopped", st.is_ok(), || {
        super::show(&st)
    });
    let res = ctx.rt.run(&["start", &id])?;
    ctx.check_refused("start after kill refused", &res);
    let res = ctx.rt.run(&["delete", &id])?;
    ctx.check_ok("delete after kill succeeds", &res);
    Ok(())
}

fn delete_force(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let (id, pid) = ctx.start_sleeper(&mut b)?;
    let res = ctx.rt.run(&["delete", "--force", &id])?;
    ctx.check_ok("delete --force of a running container succeeds", &res);
    let st = ctx.state(&id);
    ctx.check("state refused after delete --force", st.is_err(), || {
        super::show(&st)
    });
    ctx.check(
        "init killed by delete --force",
        wait_gone(i64::from(pid)),
        || format!("pid {pid} still alive"),
    );
    let mut b = ctx.bundle()?;
    b.args(&["/bin/sleep", "600"]);
    let id = ctx.id();
    let res = create(ctx, &b, &id, &[])?;
    if !res.success() {
        bail!("create: {}", res.describe());
    }
    let res = ctx.rt.run(&["delete", "--force", &id])?;
    ctx.check_ok("delete --force of a created container succeeds", &res);
    let st = ctx.state(&id);
    ctx.check(
        "created container gone after delete --force",
        st.is_err(),
        || super::show(&st),
    );
    Ok(())
}

fn duplicate_id(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.args(&["/bin/sleep", "600"]);
    let id = ctx.id();
    let res = create(ctx, &b, &id, &[])?;
    if !res.success() {
        bail!("create: {}", res.describe());
    }
    let mut b2 = ctx.bundle()?;
    b2.args(&["/bin/sleep", "600"]);
    let res = create(ctx, &b2, &id, &[])?;
    ctx.check_refused("create with a duplicate id refused", &res);
    let st = ctx.state(&id);
    ctx.check(
        "first container untouched",
        st.as_ref()
            .is_ok_and(|s| s["status"] == "created" && s["bundle"].as_str() == Some(&b.dir_str())),
        || super::show(&st),
    );
    Ok(())
}

fn errors(ctx: &mut Ctx) -> Result<()> {
    let unknown = format!("{}-no-such-container", ctx.env.tag);
    for (name, args) in [
        ("state of an unknown id refused", vec!["state"]),
        ("start of an unknown id refused", vec!["start"]),
        ("kill of an unknown id refused", vec!["kill"]),
        ("delete of an unknown id refused", vec!["delete"]),
    ] {
        let mut args = args;
        args.push(&unknown);
        let res = ctx.rt.run(&args)?;
        ctx.check_refused(name, &res);
    }
    let res = ctx.rt.run(&["delete", "--force", &unknown])?;
    ctx.check_ok("delete --force of an unknown id succeeds", &res);
    let b = ctx.bundle()?;
    let id = ctx.id();
    let dir = b.dir_str();
    let res = ctx.rt.run(&["create", "--bundle", &dir, &id])?;
    ctx.check_refused("create without config.json refused", &res);
    let mut b = ctx.bundle()?;
    b.set("/root/path", json!("no-such-rootfs"));
    let id = ctx.id();
    let res = create(ctx, &b, &id, &[])?;
    ctx.check_refused("create with a missing rootfs refused", &res);
    let mut b = ctx.bundle()?;
    b.args(&["/no/such/binary"]);
    let id = ctx.id();
    let res = create(ctx, &b, &id, &[])?;
    ctx.check_refused("create with a missing executable refused", &res);
    let st = ctx.state(&id);
    ctx.check("failed create leaves no container", st.is_err(), || {
        super::show(&st)
    });
    Ok(())
}

fn run_exit(ctx: &mut Ctx, script: &str) -> Result<crate::runtime::Output> {
    let mut b = ctx.bundle()?;
    b.args(&["/bin/sh", "-c", script]);
    b.write()?;
    let id = ctx.id();
    let res = ctx.rt.run(&["run", "--bundle", &b.dir_str(), &id])?;
    ctx.rt.quiet(&["delete", "--force", &id]);
    Ok(res)
}

fn exit_codes(ctx: &mut Ctx) -> Result<()> {
    for code in [0, 3, 255] {
        let res = run_exit(ctx, &format!("exit {code}"))?;
        ctx.check(format!("run exits {code}"), res.code == Some(code), || {
            res.describe()
        });
    }
    let res = run_exit(ctx, "echo to-stdout; echo to-stderr >&2")?;
    ctx.check("stdout passed through", res.stdout == "to-stdout\n", || {
        format!("stdout {:?}", res.stdout)
    });
    ctx.check(
        "stderr passed through",
        res.stderr.contains("to-stderr"),
        || format!("stderr {:?}", res.stderr),
    );
    // Init killed from outside: run reports 128 + SIGKILL.
    let (mut b, out) = bundle_with_out(ctx)?;
    b.args(&[
        "/bin/sh",
        "-c",
        "echo ready > /out/ready; while true; do sleep 0.05; done",
    ]);
    b.write()?;
    let id = ctx.id();
    let pending = ctx.rt.spawn(&["run", "--bundle", &b.dir_str(), &id])?;
    let ready = wait_file(&out.join("ready")).is_some();
    let killed = ready && ctx.rt.run(&["kill", &id, "KILL"])?.success();
    let res = pending.wait(crate::runtime::TIMEOUT)?;
    ctx.check(
        "run exits 137 when init is killed",
        killed && res.code == Some(137),
        || format!("ready {ready}, kill ok {killed}, {}", res.describe()),
    );
    Ok(())
}

/// The freezer state of `pid`'s cgroup as the host sees it.
fn frozen(pid: i32) -> Option<bool> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let v1 = cg.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        ctrls
            .split(',')
            .any(|c| c == "freezer")
            .then(|| path.to_string())
    });
    if let (Some(path), Some(mnt)) = (v1, host_mount(Some("freezer"))) {
        let f = mnt.join(path.trim_start_matches('/')).join("freezer.state");
        let s = std::fs::read_to_string(f).ok()?;
        return Some(s.trim() == "FROZEN");
    }
    let path = cg.lines().find_map(|l| l.strip_prefix("0::"))?;
    let f = host_mount(None)?
        .join(path.trim_start_matches('/'))
        .join("cgroup.freeze");
    let s = std::fs::read_to_string(f).ok()?;
    Some(s.trim() == "1")
}

fn pause_resume(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let (id, pid) = ctx.start_sleeper(&mut b)?;
    let res = ctx.rt.run(&["pause", &id])?;
    ctx.check_ok("pause succeeds", &res);
    let st = ctx.state(&id);
    ctx.check(
        "state paused",
        st.as_ref().is_ok_and(|s| s["status"] == "paused"),
        || super::show(&st),
    );
    let f = frozen(pid);
    ctx.check("cgroup frozen", f == Some(true), || {
        format!("frozen: {f:?}")
    });
    let res = ctx.rt.run(&["ps", "--format", "json", &id])?;
    let pids: Vec<i64> = serde_json::from_str(&res.stdout).unwrap_or_default();
    ctx.check(
        "ps --format json of a paused container lists its pids",
        res.success() && !pids.is_empty(),
        || format!("{}: {:?}", res.describe(), res.stdout),
    );
    let res = ctx.rt.run(&["ps", &id])?;
    ctx.check(
        "ps of a paused container lists its processes",
        res.success() && res.stdout.lines().count() > 1,
        || format!("{}: {:?}", res.describe(), res.stdout),
    );
    let res = ctx.rt.run(&["list"])?;
    ctx.check(
        "list shows paused",
        res.stdout
            .lines()
            .any(|l| l.starts_with(&id) && l.contains("paused")),
        || res.stdout.clone(),
    );
    let res = ctx.rt.run(&["resume", &id])?;
    ctx.check_ok("resume succeeds", &res);
    let st = ctx.state(&id);
    ctx.check(
        "state running after resume",
        st.as_ref().is_ok_and(|s| s["status"] == "running"),
        || super::show(&st),
    );
    let f = frozen(pid);
    ctx.check("cgroup thawed", f == Some(false), || {
        format!("frozen: {f:?}")
    });
    let res = ctx.rt.run(&["resume", &id])?;
    ctx.check_refused("resume of a running container refused", &res);
    let res = ctx.rt.run(&["pause", &id])?;
    if res.success() {
        let res = ctx.rt.run(&["delete", "--force", &id])?;
        ctx.check_ok("delete --force of a paused container succeeds", &res);
        ctx.check(
            "paused init killed by delete --force",
            wait_gone(i64::from(pid)),
            || format!("pid {pid} still alive"),
        );
    } else {
        ctx.check(
            "delete --force of a paused container succeeds",
            false,
            || format!("second pause failed: {}", res.describe()),
        );
    }
    Ok(())
}
