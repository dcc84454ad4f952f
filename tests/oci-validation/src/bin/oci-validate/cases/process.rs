//! process: args, env, cwd, user, groups, umask, rlimits, no_new_privs.

use anyhow::Result;
use oci_validation::expect::{Check, Expectations, Probe};
use oci_validation::{CHECKER_PATH, EXPECT_PATH};
use serde_json::json;

use super::{CaseFn, Ctx};

pub const CASES: &[(&str, CaseFn)] = &[
    ("process-basic", basic),
    ("process-user", user),
    ("process-cwd-created", cwd_created),
    ("process-path-lookup", path_lookup),
    ("process-lookup-errors", lookup_errors),
    ("rlimits", rlimits),
];

/// Set in the harness's own environment; a container must never see it.
pub const HOST_ONLY_VAR: &str = "OCI_VALIDATE_HOST_ONLY";

fn env(var: &str, value: Option<&str>) -> Check {
    Check::Env {
        var: var.to_string(),
        value: value.map(str::to_string),
    }
}

fn basic(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let args = [
        CHECKER_PATH,
        EXPECT_PATH,
        "two words",
        "ünïcode",
        "",
        "--flag=x",
    ];
    b.args(&args);
    let vars = [
        ("PATH", "/bin:/sbin"),
        ("TERM", "xterm"),
        ("OCI_A", "1"),
        ("OCI_SPACES", "a b  c"),
        ("OCI_EQUALS", "x=y=z"),
        ("OCI_EMPTY", ""),
    ];
    let env_list: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
    b.set("/process/env", json!(env_list));
    b.set("/process/cwd", json!("/tmp"));
    let mut e = Expectations::default();
    e.push(
        "args passed verbatim",
        Check::Args {
            args: args.iter().map(|s| (*s).to_string()).collect(),
        },
    );
    for (k, v) in vars {
        e.push(format!("env {k}"), env(k, Some(v)));
    }
    e.push(
        "env HOME defaulted from /etc/passwd",
        env("HOME", Some("/root")),
    );
    e.push("env of the runtime not leaked", env(HOST_ONLY_VAR, None));
    e.push(
        "cwd",
        Check::Cwd {
            path: "/tmp".into(),
        },
    );
    e.push("uid 0", Check::Uid { uid: 0 });
    e.push("gid 0", Check::Gid { gid: 0 });
    e.push("groups empty", Check::Groups { gids: vec![] });
    e.push("pid 1 in the pid namespace", Check::Pid { pid: 1 });
    for fd in 0..3 {
        e.push(format!("fd {fd} not a tty"), Check::Tty { fd, tty: false });
    }
    e.push(
        "hostname",
        Check::FileContent {
            path: "/proc/sys/kernel/hostname".into(),
            content: "oci-validate".into(),
        },
    );
    let status = |f: &str, v: &str| Check::Status {
        field: f.into(),
        value: v.into(),
    };
    e.push("noNewPrivileges true", status("NoNewPrivs", "1"));
    e.push("no seccomp filter", status("Seccomp", "0"));
    ctx.run_checker(&b, &e)?;
    Ok(())
}

fn user(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.set(
        "/process/user",
        json!({"uid": 1000, "gid": 1000, "additionalGids": [10, 20, 1234], "umask": 0o027}),
    );
    b.set("/process/noNewPrivileges", json!(false));
    b.set("/process/cwd", json!("/home/user"));
    let probe = "/tmp/umask-probe";
    let mut e = Expectations::default();
    e.push("uid 1000", Check::Uid { uid: 1000 });
    e.push("gid 1000", Check::Gid { gid: 1000 });
    e.push(
        "additionalGids",
        Check::Groups {
            gids: vec![10, 20, 1234],
        },
    );
    e.push("umask 0027", Check::Umask { mask: 0o027 });
    e.push(
        "noNewPrivileges false",
        Check::Status {
            field: "NoNewPrivs".into(),
            value: "0".into(),
        },
    );
    e.push(
        "env HOME of uid 1000 from /etc/passwd",
        env("HOME", Some("/home/user")),
    );
    e.push(
        "cwd /home/user",
        Check::Cwd {
            path: "/home/user".into(),
        },
    );
    e.push(
        "file created as uid 1000",
        Check::Syscall {
            probe: Probe::WriteFile { path: probe.into() },
            errno: None,
        },
    );
    e.push(
        "new file mode follows umask, owner uid:gid",
        Check::Node {
            path: probe.into(),
            node_type: 'f',
            major: None,
            minor: None,
            mode: Some(0o640),
            uid: Some(1000),
            gid: Some(1000),
        },
    );
    e.push(
        "no root privileges",
        Check::Syscall {
            probe: Probe::WriteFile {
                path: "/root/forbidden".into(),
            },
            errno: Some(libc::EACCES),
        },
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

fn cwd_created(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.set("/process/cwd", json!("/oci/new/cwd"));
    let mut e = Expectations::default();
    e.push(
        "missing cwd is created",
        Check::Cwd {
            path: "/oci/new/cwd".into(),
        },
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

fn path_lookup(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let name = CHECKER_PATH.trim_start_matches('/');
    b.args(&[name, EXPECT_PATH]);
    b.set("/process/env", json!(["PATH=/bin:/"]));
    let mut e = Expectations::default();
    e.push(
        "args[0] found through PATH",
        Check::Args {
            args: vec![name.into(), EXPECT_PATH.into()],
        },
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

/// The executable's lookup at `create`, as runc 1.1 does it (Go's
/// `exec.LookPath` in the container): its messages are what Docker, Podman
/// and containerd read for exit codes 127 (not found) and 126 (cannot run),
/// and a file any of whose execute bits is set runs.
fn lookup_errors(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let root = b.rootfs();
    let script = |path: &str, mode: u32| -> Result<()> {
        let p = root.join(path.trim_start_matches('/'));
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&p, "#!/bin/sh\nexit 0\n")?;
        crate::bundle::set_mode(&p, mode)
    };
    script("/oci/lookup/owner-only", 0o700)?;
    script("/oci/lookup/plain", 0o644)?;
    script("/oci/lookup/a/tool", 0o644)?;
    script("/oci/lookup/b/tool", 0o755)?;

    let refusals: &[(&str, &[&str], &str, &str)] = &[
        (
            "a missing path: stat's no such file or directory",
            &["/oci/lookup/missing"],
            "PATH=/bin",
            "exec: \"/oci/lookup/missing\": stat /oci/lookup/missing: no such file or directory",
        ),
        (
            "a path below a file: stat's not a directory",
            &["/oci/lookup/plain/x"],
            "PATH=/bin",
            "exec: \"/oci/lookup/plain/x\": stat /oci/lookup/plain/x: not a directory",
        ),
        (
            "a name nowhere in PATH: executable file not found in $PATH",
            &["oci-missing"],
            "PATH=/bin:/oci/lookup",
            "exec: \"oci-missing\": executable file not found in $PATH",
        ),
        (
            "a name only non-executable in PATH: not found",
            &["plain"],
            "PATH=/oci/lookup",
            "exec: \"plain\": executable file not found in $PATH",
        ),
        (
            "a file without execute bits: permission denied",
            &["/oci/lookup/plain"],
            "PATH=/bin",
            "exec: \"/oci/lookup/plain\": permission denied",
        ),
        (
            "a directory: permission denied",
            &["/oci/lookup"],
            "PATH=/bin",
            "exec: \"/oci/lookup\": permission denied",
        ),
    ];
    for (check, args, path, phrase) in refusals {
        b.args(args);
        b.set("/process/env", json!([path]));
        ctx.check_run_refused(&b, check, phrase)?;
    }

    let runs: &[(&str, &[&str], &str)] = &[
        (
            "a file only its owner may execute runs",
            &["/oci/lookup/owner-only"],
            "PATH=/bin",
        ),
        (
            "PATH's first match without execute bits is skipped",
            &["tool"],
            "PATH=/oci/lookup/a:/oci/lookup/b",
        ),
    ];
    for (check, args, path) in runs {
        b.args(args);
        b.set("/process/env", json!([path]));
        b.write()?;
        let id = ctx.id();
        let out = ctx.rt.run(&["run", "--bundle", &b.dir_str(), &id])?;
        ctx.check_ok(check, &out);
        ctx.rt.quiet(&["delete", "--force", &id]);
    }
    Ok(())
}

/// Limits below the host's hard limits: root cannot raise those here.
const RLIMITS: &[(&str, u64, u64)] = &[
    ("RLIMIT_NOFILE", 512, 1024),
    ("RLIMIT_NPROC", 1000, 2000),
    ("RLIMIT_CORE", 0, 1 << 20),
    ("RLIMIT_MEMLOCK", 65536, 131072),
    ("RLIMIT_MSGQUEUE", 4096, 8192),
    ("RLIMIT_STACK", 8 << 20, 16 << 20),
    ("RLIMIT_CPU", 1000, 2000),
    ("RLIMIT_SIGPENDING", 500, 1000),
    ("RLIMIT_FSIZE", 1 << 30, 2 << 30),
    ("RLIMIT_LOCKS", 100, 200),
];

fn rlimits(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let list: Vec<_> = RLIMITS
        .iter()
        .map(|(t, s, h)| json!({"type": t, "soft": s, "hard": h}))
        .collect();
    b.set("/process/rlimits", json!(list));
    let mut e = Expectations::default();
    for (t, s, h) in RLIMITS {
        e.push(
            *t,
            Check::Rlimit {
                resource: (*t).into(),
                soft: *s,
                hard: *h,
            },
        );
    }
    ctx.run_checker(&b, &e)?;
    Ok(())
}
