//! hooks: all six kinds run, in order, with the state on stdin; failing and
//! timed-out hooks.

use std::path::Path;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::lifecycle::bundle_with_out;
use super::{CaseFn, Ctx};

pub const CASES: &[(&str, CaseFn)] = &[
    ("hooks", hooks),
    ("hooks-failing", failing),
    ("hooks-cwd", cwd),
    ("hooks-error", error),
];

const KINDS: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// A hook that saves its stdin to LOG/KIND.json and appends its argv[0]
/// (KIND) to LOG/order. `sh` is the host's for every hook but
/// startContainer, whose path and log resolve inside the container.
fn hook(kind: &str, sh: &str, log: &str) -> Value {
    json!({
        "path": sh,
        "args": ["sh", "-c", format!("cat > {log}/$0.json; echo $0 >> {log}/order; \
                                      echo \"$OCI_HOOK_VAR\" > {log}/$0.env"), kind],
        "env": ["OCI_HOOK_VAR=hook-env-passed"]
    })
}

fn order(out: &Path) -> Vec<String> {
    std::fs::read_to_string(out.join("order"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn before(ctx: &mut Ctx, order: &[String], a: &str, b: &str) {
    let pa = order.iter().position(|k| k == a);
    let pb = order.iter().position(|k| k == b);
    ctx.check(
        format!("{a} before {b}"),
        matches!((pa, pb), (Some(x), Some(y)) if x < y),
        || format!("order {order:?}"),
    );
}

fn hooks(ctx: &mut Ctx) -> Result<()> {
    let (mut b, out) = bundle_with_out(ctx)?;
    let host_log = out.to_string_lossy().into_owned();
    for kind in KINDS {
        let h = match kind {
            "startContainer" => hook(kind, "/bin/sh", "/out"),
            _ => hook(kind, "/bin/sh", &host_log),
        };
        b.push(&format!("/hooks/{kind}"), h);
    }
    b.args(&["/bin/sh", "-c", "echo workload >> /out/order"]);
    b.write()?;
    let id = ctx.id();
    let res = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    if !ctx.check_ok("create with hooks succeeds", &res) {
        bail!("create failed: {}", res.describe());
    }
    let after_create = order(&out);
    let create_time = ["prestart", "createRuntime", "createContainer"];
    ctx.check(
        "create runs prestart, createRuntime, createContainer",
        create_time
            .iter()
            .all(|k| after_create.iter().any(|o| o == k)),
        || format!("after create: {after_create:?}"),
    );
    // runc 1.1 runs poststart at create time; the spec puts it after the
    // process starts. Only what both agree on is checked here.
    ctx.check(
        "startContainer waits for start",
        !after_create
            .iter()
            .any(|o| o == "startContainer" || o == "workload"),
        || format!("after create: {after_create:?}"),
    );
    let init_pid = ctx.state(&id).ok().and_then(|s| s["pid"].as_i64());
    let res = ctx.rt.run(&["start", &id])?;
    ctx.check_ok("start with hooks succeeds", &res);
    let after_start = order(&out);
    ctx.check(
        "poststart ran before start returned",
        after_start.iter().any(|k| k == "poststart"),
        || format!("after start: {after_start:?}"),
    );
    let st = ctx.wait_status(&id, "stopped");
    ctx.check("workload ran and exited", st.is_ok(), || super::show(&st));
    ctx.check(
        "poststop not run before delete",
        !order(&out).iter().any(|k| k == "poststop"),
        || format!("order {:?}", order(&out)),
    );
    let res = ctx.rt.run(&["delete", &id])?;
    ctx.check_ok("delete with hooks succeeds", &res);
    let all = order(&out);
    for kind in KINDS {
        let n = all.iter().filter(|k| *k == kind).count();
        ctx.check(format!("{kind} ran once"), n == 1, || {
            format!("order {all:?}")
        });
        let raw = std::fs::read_to_string(out.join(format!("{kind}.json"))).unwrap_or_default();
        let state: Value = serde_json::from_str(&raw).unwrap_or(Value::Null);
        ctx.check(
            format!("{kind} got the state on stdin"),
            state["id"] == id.as_str() && state["bundle"].as_str() == Some(&b.dir_str()),
            || format!("stdin was {raw:?}"),
        );
    }
    let state_of = |k: &str| -> Value {
        let raw = std::fs::read_to_string(out.join(format!("{k}.json"))).unwrap_or_default();
        serde_json::from_str(&raw).unwrap_or(Value::Null)
    };
    let cr = state_of("createRuntime");
    ctx.check(
        "createRuntime state is creating",
        cr["status"] == "creating",
        || format!("status {}", cr["status"]),
    );
    let ps = state_of("poststop");
    ctx.check(
        "poststop state is stopped",
        ps["status"] == "stopped",
        || format!("status {}", ps["status"]),
    );
    let pre = state_of("prestart");
    ctx.check(
        "prestart state pid is the init pid",
        init_pid.is_some() && pre["pid"].as_i64() == init_pid,
        || format!("hook pid {}, init pid {init_pid:?}", pre["pid"]),
    );
    let env = std::fs::read_to_string(out.join("prestart.env")).unwrap_or_default();
    ctx.check("hook env passed", env.trim() == "hook-env-passed", || {
        format!("hook saw {env:?}")
    });
    before(ctx, &all, "prestart", "createRuntime");
    before(ctx, &all, "createRuntime", "createContainer");
    before(ctx, &all, "createContainer", "startContainer");
    before(ctx, &all, "startContainer", "workload");
    before(ctx, &all, "workload", "poststop");
    ctx.check(
        "poststop runs last",
        all.last().map(String::as_str) == Some("poststop"),
        || format!("order {all:?}"),
    );
    Ok(())
}

fn failing(ctx: &mut Ctx) -> Result<()> {
    // A failing createRuntime hook fails create and leaves nothing behind.
    let mut b = ctx.bundle()?;
    b.push(
        "/hooks/createRuntime",
        json!({"path": "/bin/sh", "args": ["sh", "-c", "exit 1"]}),
    );
    b.write()?;
    let id = ctx.id();
    let res = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    ctx.check_refused("failing createRuntime hook fails create", &res);
    let st = ctx.state(&id);
    ctx.check("no container left after a failed hook", st.is_err(), || {
        super::show(&st)
    });
    // A hook past its timeout fails create.
    let mut b = ctx.bundle()?;
    b.push(
        "/hooks/prestart",
        json!({"path": "/bin/sh", "args": ["sh", "-c", "exec sleep 20"], "timeout": 1}),
    );
    b.write()?;
    let id = ctx.id();
    let res = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    ctx.check_refused("hook over its timeout fails create", &res);
    // A failing poststop hook only warns: delete still succeeds.
    let (id, res) = delete_after_failing_poststop(ctx, 1)?;
    ctx.check_ok("failing poststop hook does not fail delete", &res);
    let st = ctx.state(&id);
    ctx.check(
        "container gone despite failing poststop",
        st.is_err(),
        || super::show(&st),
    );
    Ok(())
}

/// The directory each host hook runs in, as runc gives it: the bundle for
/// the hooks `create` runs, the caller's for poststop (`delete` does not
/// change directory). The harness calls every runtime from its own cwd.
fn cwd(ctx: &mut Ctx) -> Result<()> {
    let (mut b, out) = bundle_with_out(ctx)?;
    let log = out.to_string_lossy().into_owned();
    for kind in ["prestart", "createRuntime", "poststop"] {
        b.push(
            &format!("/hooks/{kind}"),
            json!({"path": "/bin/sh", "args": ["sh", "-c", format!("pwd > {log}/{kind}.cwd")]}),
        );
    }
    b.args(&["/bin/true"]);
    b.write()?;
    let id = ctx.id();
    let res = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    if !res.success() {
        bail!("create: {}", res.describe());
    }
    ctx.rt.run(&["start", &id])?;
    let st = ctx.wait_status(&id, "stopped");
    if st.is_err() {
        bail!("container did not stop: {st:?}");
    }
    ctx.rt.run(&["delete", &id])?;
    let caller = std::env::current_dir()?.to_string_lossy().into_owned();
    for (kind, want, place) in [
        ("prestart", b.dir_str(), "the bundle"),
        ("createRuntime", b.dir_str(), "the bundle"),
        ("poststop", caller, "the caller's directory"),
    ] {
        let got = std::fs::read_to_string(out.join(format!("{kind}.cwd"))).unwrap_or_default();
        ctx.check(
            format!("{kind} runs in {place}"),
            got.trim() == want,
            || format!("cwd {:?}, want {want:?}", got.trim()),
        );
    }
    Ok(())
}

/// A failing hook's error in runc 1.1's words: the hook's index in its
/// list, Go's words for how it ended, and its stdout and stderr. The
/// message is taken from `--log-format json` (the last JSON line's `msg`
/// on stderr), where both write it unquoted; each runtime puts its own
/// words before it (`runc create failed: unable to start container
/// process: ...`), so the check is on how it ends.
fn error(ctx: &mut Ctx) -> Result<()> {
    const FAILING: &str = "echo out; echo err >&2; exit 3";
    const SAID: &str = "error running hook #1: error running hook: exit status 3, \
                        stdout: out\n, stderr: err\n";
    for kind in ["prestart", "createRuntime", "createContainer"] {
        let msg = create_error(
            ctx,
            kind,
            &[
                json!({"path": "/bin/true"}),
                json!({"path": "/bin/sh", "args": ["sh", "-c", FAILING]}),
            ],
        )?;
        ctx.check(
            format!("failing {kind} hook: runc's message (index, status, stdout, stderr)"),
            msg.as_deref().is_some_and(|m| m.ends_with(SAID)),
            || format!("message {msg:?}, want it to end with {SAID:?}"),
        );
    }
    for (what, hook, said) in [
        (
            "timed-out",
            json!({"path": "/bin/sh", "args": ["sh", "-c", "echo out; exec sleep 20"], "timeout": 1}),
            "error running hook #0: hook ran past specified timeout of 1.0s",
        ),
        (
            "missing",
            json!({"path": "/nonexistent/oci-hook"}),
            "error running hook #0: fork/exec /nonexistent/oci-hook: no such file or directory",
        ),
        (
            "killed",
            json!({"path": "/bin/sh", "args": ["sh", "-c", "echo out; kill -9 $$"]}),
            "error running hook #0: error running hook: signal: killed, stdout: out\n, stderr: ",
        ),
    ] {
        let msg = create_error(ctx, "prestart", &[hook])?;
        ctx.check(
            format!("{what} prestart hook: runc's message"),
            msg.as_deref().is_some_and(|m| m.ends_with(said)),
            || format!("message {msg:?}, want it to end with {said:?}"),
        );
    }
    // runc 1.1 runs poststart hooks at create, agentvm at start: the
    // message is taken from whichever fails.
    let mut b = ctx.bundle()?;
    b.push("/hooks/poststart", json!({"path": "/bin/true"}));
    b.push("/hooks/poststart", json!({"path": "/bin/true"}));
    b.push(
        "/hooks/poststart",
        json!({"path": "/bin/sh", "args": ["sh", "-c", "echo out; echo err >&2; exit 5"]}),
    );
    b.args(&["/bin/sleep", "600"]);
    b.write()?;
    let id = ctx.id();
    let mut res = ctx.rt.run(&[
        "--log-format",
        "json",
        "create",
        "--bundle",
        &b.dir_str(),
        &id,
    ])?;
    if res.success() {
        res = ctx.rt.run(&["--log-format", "json", "start", &id])?;
    }
    let msg = (!res.success()).then(|| json_error(&res.stderr)).flatten();
    let said =
        "error running hook #2: error running hook: exit status 5, stdout: out\n, stderr: err\n";
    ctx.check(
        "failing poststart hook: runc's message",
        msg.as_deref().is_some_and(|m| m.ends_with(said)),
        || {
            format!(
                "message {msg:?}, want it to end with {said:?}; {}",
                res.describe()
            )
        },
    );
    // A failing poststop hook is logged at level error, alone.
    let (_, res) = delete_after_failing_poststop(ctx, 4)?;
    let msg = json_error(&res.stderr);
    let said =
        "error running hook #1: error running hook: exit status 4, stdout: out\n, stderr: err\n";
    ctx.check(
        "failing poststop hook: delete logs runc's message",
        res.success() && msg.as_deref() == Some(said),
        || format!("logged {msg:?}, want {said:?}; {}", res.describe()),
    );
    Ok(())
}

/// `create` of a bundle with `hooks` as its `kind` hooks (and `/bin/true`
/// as the workload): the error message when it fails, else None.
fn create_error(ctx: &mut Ctx, kind: &str, hooks: &[Value]) -> Result<Option<String>> {
    let mut b = ctx.bundle()?;
    for h in hooks {
        b.push(&format!("/hooks/{kind}"), h.clone());
    }
    b.args(&["/bin/true"]);
    b.write()?;
    let id = ctx.id();
    let res = ctx.rt.run(&[
        "--log-format",
        "json",
        "create",
        "--bundle",
        &b.dir_str(),
        &id,
    ])?;
    if res.success() {
        return Ok(None);
    }
    Ok(json_error(&res.stderr))
}

/// The `msg` of the last JSON line at level error in `stderr`.
fn json_error(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["level"] == "error")
        .find_map(|v| v["msg"].as_str().map(str::to_string))
}

/// Runs `/bin/true` with two poststop hooks, the second printing `out` and
/// `err` and exiting with `status`, and deletes the stopped container
/// (`--log-format json`): the id and what `delete` gave.
fn delete_after_failing_poststop(
    ctx: &mut Ctx,
    status: u8,
) -> Result<(String, super::super::runtime::Output)> {
    let mut b = ctx.bundle()?;
    b.push("/hooks/poststop", json!({"path": "/bin/true"}));
    b.push(
        "/hooks/poststop",
        json!({"path": "/bin/sh",
               "args": ["sh", "-c", format!("echo out; echo err >&2; exit {status}")]}),
    );
    b.args(&["/bin/true"]);
    b.write()?;
    let id = ctx.id();
    let res = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    if !res.success() {
        bail!("create: {}", res.describe());
    }
    ctx.rt.run(&["start", &id])?;
    let st = ctx.wait_status(&id, "stopped");
    if st.is_err() {
        bail!("container did not stop: {st:?}");
    }
    let res = ctx.rt.run(&["--log-format", "json", "delete", &id])?;
    Ok((id, res))
}
