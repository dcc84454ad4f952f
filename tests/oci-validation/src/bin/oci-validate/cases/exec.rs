//! exec: a new process joins the running container's namespaces, cgroup and
//! security settings, with its own args, env, cwd and user.

use anyhow::{Context, Result};
use oci_validation::caps;
use oci_validation::expect::{Check, Expectations, Relation};
use oci_validation::CHECKER_PATH;
use serde_json::json;

use super::{ns_check, CaseFn, Ctx};
use crate::bundle::DEFAULT_CAPS;

pub const CASES: &[(&str, CaseFn)] = &[("exec", exec), ("exec-process-file", process_file)];

fn exec(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let (id, _pid) = ctx.start_sleeper(&mut b)?;
    let mut e = Expectations::default();
    for ns in ["pid", "net", "ipc", "uts", "mnt", "cgroup"] {
        e.push(
            format!("joins the init's {ns} namespace"),
            ns_check(ns, Relation::Same, format!("/proc/1/ns/{ns}")),
        );
    }
    e.push(
        "joins the init's cgroup",
        Check::SameContent {
            path: "/proc/self/cgroup".into(),
            other: "/proc/1/cgroup".into(),
        },
    );
    let default = caps::mask(DEFAULT_CAPS).map_err(anyhow::Error::msg)?;
    for (field, what) in [("CapBnd", "bounding"), ("CapEff", "effective")] {
        e.push(
            format!("{what} capabilities of the container"),
            Check::CapSet {
                field: field.into(),
                mask: default,
            },
        );
    }
    e.push(
        "noNewPrivileges of the container",
        Check::Status {
            field: "NoNewPrivs".into(),
            value: "1".into(),
        },
    );
    e.push(
        "hostname of the container",
        Check::FileContent {
            path: "/proc/sys/kernel/hostname".into(),
            content: "oci-validate".into(),
        },
    );
    e.push(
        "--env added",
        Check::Env {
            var: "OCI_EXEC".into(),
            value: Some("from exec".into()),
        },
    );
    e.push(
        "env of the container kept",
        Check::Env {
            var: "PATH".into(),
            value: Some("/bin:/sbin".into()),
        },
    );
    e.push(
        "--cwd applied",
        Check::Cwd {
            path: "/tmp".into(),
        },
    );
    e.push("root by default", Check::Uid { uid: 0 });
    ctx.exec_checker(
        &b,
        &id,
        &e,
        &["--env", "OCI_EXEC=from exec", "--cwd", "/tmp"],
    )?;
    let mut e = Expectations::default();
    e.push("--user uid", Check::Uid { uid: 1000 });
    e.push("--user gid", Check::Gid { gid: 1000 });
    e.push(
        "--additional-gids",
        Check::Groups {
            gids: vec![10, 1234],
        },
    );
    ctx.exec_checker(
        &b,
        &id,
        &e,
        &[
            "--user",
            "1000:1000",
            "--additional-gids",
            "10",
            "--additional-gids",
            "1234",
        ],
    )?;
    // runc's `--cap` adds to the bounding, effective and permitted sets
    // (not ambient: the process has no inheritable set) a name spelled as
    // the spec spells it; any other spelling is ignored with a warning.
    let with_admin =
        caps::mask(&[DEFAULT_CAPS, &["CAP_SYS_ADMIN"]].concat()).map_err(anyhow::Error::msg)?;
    let mut e = Expectations::default();
    for (field, what) in [
        ("CapBnd", "bounding"),
        ("CapEff", "effective"),
        ("CapPrm", "permitted"),
    ] {
        e.push(
            format!("--cap CAP_SYS_ADMIN added to the {what} set"),
            Check::CapSet {
                field: field.into(),
                mask: with_admin,
            },
        );
    }
    e.push(
        "--cap adds nothing ambient without inheritable",
        Check::CapSet {
            field: "CapAmb".into(),
            mask: 0,
        },
    );
    ctx.exec_checker(&b, &id, &e, &["--cap", "CAP_SYS_ADMIN"])?;
    let res = ctx.rt.run(&[
        "exec",
        "--cap",
        "SYS_ADMIN",
        "--cap",
        "CAP_BOGUS",
        "--cap",
        "SYS_ADMIN",
        &id,
        "/bin/grep",
        "CapEff",
        "/proc/self/status",
    ])?;
    let plain = format!("CapEff:\t{default:016x}\n");
    ctx.check(
        "--cap of an unknown name is ignored with runc's warning",
        res.code == Some(0)
            && res.stdout == plain
            && res
                .stderr
                .contains("ignoring unknown or unavailable capabilities: [CAP_BOGUS SYS_ADMIN]"),
        || format!("{}: stdout {:?}", res.describe(), res.stdout),
    );
    let res = ctx.rt.run(&["exec", &id, "/bin/sh", "-c", "exit 7"])?;
    ctx.check("exec exit code propagated", res.code == Some(7), || {
        res.describe()
    });
    let res = ctx.rt.run(&["exec", &id, "/bin/echo", "from exec"])?;
    ctx.check(
        "exec stdout passed through",
        res.stdout == "from exec\n",
        || format!("{}: stdout {:?}", res.describe(), res.stdout),
    );
    let dir = ctx.scratch("exec")?;
    let pidfile = dir.join("exec.pid");
    let res = ctx.rt.run(&[
        "exec",
        "--detach",
        "--pid-file",
        &pidfile.to_string_lossy(),
        &id,
        "/bin/sleep",
        "600",
    ])?;
    ctx.check_ok("exec --detach returns", &res);
    let pid = std::fs::read_to_string(&pidfile).unwrap_or_default();
    let pid: i32 = pid.trim().parse().unwrap_or(0);
    // runc returns while its init may still be inside execve(2) (seen
    // once: runc's exec read an empty cmdline): give the exec 2 s to land.
    let mut comm = String::new();
    for _ in 0..100 {
        comm = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if pid <= 0 || comm.starts_with("/bin/sleep") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    ctx.check(
        "exec --pid-file holds the detached process",
        pid > 0 && comm.starts_with("/bin/sleep"),
        || format!("pid {pid}, cmdline {comm:?}"),
    );
    let res = ctx.rt.run(&["kill", &id, "KILL"])?;
    ctx.check_ok("kill of a running container succeeds", &res);
    let st = ctx.wait_status(&id, "stopped");
    ctx.check("container stopped", st.is_ok(), || super::show(&st));
    let res = ctx.rt.run(&["exec", &id, "/bin/true"])?;
    ctx.check_refused("exec in a stopped container refused", &res);
    Ok(())
}

fn process_file(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let (id, _pid) = ctx.start_sleeper(&mut b)?;
    let expect = "/oci-expect-process.json";
    let mut e = Expectations::default();
    e.push(
        "args from process.json",
        Check::Args {
            args: vec![CHECKER_PATH.into(), expect.into(), "extra arg".into()],
        },
    );
    e.push(
        "env from process.json",
        Check::Env {
            var: "OCI_PROCESS_FILE".into(),
            value: Some("yes".into()),
        },
    );
    e.push(
        "env of the container replaced",
        Check::Env {
            var: "TERM".into(),
            value: None,
        },
    );
    e.push(
        "cwd from process.json",
        Check::Cwd {
            path: "/home/user".into(),
        },
    );
    e.push("user from process.json", Check::Uid { uid: 1000 });
    e.push(
        "capabilities from process.json",
        Check::CapSet {
            field: "CapBnd".into(),
            mask: caps::mask(&["CAP_KILL"]).map_err(anyhow::Error::msg)?,
        },
    );
    b.write_expect_at(expect, &e)?;
    let process = json!({
        "terminal": false,
        "user": {"uid": 1000, "gid": 1000},
        "args": [CHECKER_PATH, expect, "extra arg"],
        "env": ["PATH=/bin", "OCI_PROCESS_FILE=yes"],
        "cwd": "/home/user",
        "capabilities": {"bounding": ["CAP_KILL"], "effective": ["CAP_KILL"], "permitted": ["CAP_KILL"]},
        "noNewPrivileges": true
    });
    let dir = ctx.scratch("process")?;
    let pfile = dir.join("process.json");
    std::fs::write(&pfile, serde_json::to_vec(&process)?).context("write process.json")?;
    let res = ctx
        .rt
        .run(&["exec", "--process", &pfile.to_string_lossy(), &id])?;
    ctx.record_lines(&e, &res.stdout, &res.describe());
    Ok(())
}
