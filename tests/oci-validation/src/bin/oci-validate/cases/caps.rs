//! process.capabilities: all five sets, and what they allow.
//!
//! The expected sets are those after execve(2) of a binary without file
//! capabilities: for uid 0 the kernel makes permitted and effective the union
//! of bounding, inheritable and ambient; for any other uid they become the
//! ambient set.

use anyhow::{anyhow, Result};
use oci_validation::caps;
use oci_validation::expect::{Check, Expectations, Probe};
use serde_json::json;

use super::{CaseFn, Ctx};
use crate::bundle::DEFAULT_CAPS;

pub const CASES: &[(&str, CaseFn)] = &[
    ("caps-default", default),
    ("caps-nonroot-ambient", nonroot_ambient),
    ("caps-root-inheritable", root_inheritable),
    ("caps-runc-spec-default", runc_spec_default),
    ("caps-unknown-names", unknown_names),
];

fn mask(names: &[&str]) -> Result<u64> {
    caps::mask(names).map_err(|n| anyhow!("unknown capability {n}"))
}

/// Expectations for the five sets, in /proc/self/status order.
fn sets(
    e: &mut Expectations,
    inh: &[&str],
    prm: &[&str],
    eff: &[&str],
    bnd: &[&str],
    amb: &[&str],
) -> Result<()> {
    for (field, set, what) in [
        ("CapInh", inh, "inheritable"),
        ("CapPrm", prm, "permitted"),
        ("CapEff", eff, "effective"),
        ("CapBnd", bnd, "bounding"),
        ("CapAmb", amb, "ambient"),
    ] {
        e.push(
            what,
            Check::CapSet {
                field: field.into(),
                mask: mask(set)?,
            },
        );
    }
    Ok(())
}

fn syscall(probe: Probe, errno: Option<i32>) -> Check {
    Check::Syscall { probe, errno }
}

fn default(ctx: &mut Ctx) -> Result<()> {
    let b = ctx.bundle()?;
    let mut e = Expectations::default();
    sets(&mut e, &[], DEFAULT_CAPS, DEFAULT_CAPS, DEFAULT_CAPS, &[])?;
    e.push(
        "chown refused without CAP_CHOWN",
        syscall(
            Probe::Chown {
                path: "/tmp".into(),
                uid: 1,
                gid: 1,
            },
            Some(libc::EPERM),
        ),
    );
    e.push(
        "sethostname refused without CAP_SYS_ADMIN",
        syscall(
            Probe::Sethostname {
                name: "changed".into(),
            },
            Some(libc::EPERM),
        ),
    );
    e.push(
        "write to another user's dir refused without CAP_DAC_OVERRIDE",
        syscall(
            Probe::WriteFile {
                path: "/home/user/x".into(),
            },
            Some(libc::EACCES),
        ),
    );
    e.push(
        "bind port 80 with CAP_NET_BIND_SERVICE",
        syscall(Probe::BindTcp { port: 80 }, None),
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

fn nonroot_ambient(ctx: &mut Ctx) -> Result<()> {
    let bnd = [
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_KILL",
        "CAP_NET_BIND_SERVICE",
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_SYS_CHROOT",
    ];
    let inh = ["CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"];
    let prm = [
        "CAP_CHOWN",
        "CAP_KILL",
        "CAP_NET_BIND_SERVICE",
        "CAP_SETUID",
    ];
    let amb = ["CAP_KILL", "CAP_NET_BIND_SERVICE"];
    let mut b = ctx.bundle()?;
    b.set("/process/user", json!({"uid": 1000, "gid": 1000}));
    b.set(
        "/process/capabilities",
        json!({"bounding": bnd, "inheritable": inh, "permitted": prm, "effective": prm, "ambient": amb}),
    );
    let mut e = Expectations::default();
    sets(&mut e, &inh, &amb, &amb, &bnd, &amb)?;
    e.push(
        "ambient CAP_NET_BIND_SERVICE lets uid 1000 bind port 80",
        syscall(Probe::BindTcp { port: 80 }, None),
    );
    let probe = "/tmp/caps-probe";
    e.push(
        "uid 1000 creates a file",
        syscall(Probe::WriteFile { path: probe.into() }, None),
    );
    e.push(
        "chown refused: CAP_CHOWN not ambient",
        syscall(
            Probe::Chown {
                path: probe.into(),
                uid: 0,
                gid: 0,
            },
            Some(libc::EPERM),
        ),
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

fn root_inheritable(ctx: &mut Ctx) -> Result<()> {
    let bnd = [
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FOWNER",
        "CAP_KILL",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT",
        "CAP_AUDIT_WRITE",
    ];
    let inh = ["CAP_KILL", "CAP_NET_BIND_SERVICE"];
    let amb = ["CAP_NET_BIND_SERVICE"];
    let mut b = ctx.bundle()?;
    b.set(
        "/process/capabilities",
        json!({"bounding": bnd, "inheritable": inh, "permitted": bnd, "effective": bnd, "ambient": amb}),
    );
    let mut e = Expectations::default();
    sets(&mut e, &inh, &bnd, &bnd, &bnd, &amb)?;
    let probe = "/tmp/caps-probe";
    e.push(
        "root creates a file",
        syscall(Probe::WriteFile { path: probe.into() }, None),
    );
    e.push(
        "chown allowed with CAP_CHOWN",
        syscall(
            Probe::Chown {
                path: probe.into(),
                uid: 1,
                gid: 1,
            },
            None,
        ),
    );
    e.push(
        "write to another user's dir with CAP_DAC_OVERRIDE",
        syscall(
            Probe::WriteFile {
                path: "/home/user/x".into(),
            },
            None,
        ),
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

/// `runc spec` lists ambient capabilities without inheritable ones; the
/// kernel cannot raise those, and runc runs the container without them.
fn runc_spec_default(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.set(
        "/process/capabilities",
        json!({"bounding": DEFAULT_CAPS, "effective": DEFAULT_CAPS,
               "permitted": DEFAULT_CAPS, "ambient": DEFAULT_CAPS}),
    );
    let mut e = Expectations::default();
    sets(&mut e, &[], DEFAULT_CAPS, DEFAULT_CAPS, DEFAULT_CAPS, &[])?;
    ctx.run_checker(&b, &e)?;
    Ok(())
}

/// runc leaves out the capability names it does not know (or spells
/// otherwise: `SYS_ADMIN`, `cap_kill`) with one warning naming them, and
/// runs the container with the rest; so does `exec`, for the config's and
/// `--cap`'s names together.
fn unknown_names(ctx: &mut Ctx) -> Result<()> {
    let with = |extra: &'static str| {
        let mut v: Vec<&str> = DEFAULT_CAPS.to_vec();
        v.push(extra);
        v
    };
    let mut b = ctx.bundle()?;
    b.set(
        "/process/capabilities",
        json!({"bounding": with("CAP_BOGUS"), "effective": with("SYS_ADMIN"),
               "permitted": with("cap_kill"), "inheritable": ["CAP_BOGUS"]}),
    );
    let mut e = Expectations::default();
    sets(&mut e, &[], DEFAULT_CAPS, DEFAULT_CAPS, DEFAULT_CAPS, &[])?;
    let out = ctx.run_checker(&b, &e)?;
    let warning = "ignoring unknown or unavailable capabilities: [CAP_BOGUS SYS_ADMIN cap_kill]";
    ctx.check(
        "run warns once about the names it left out",
        out.stderr.matches(warning).count() == 1,
        || format!("want {warning:?} once on stderr, got {}", out.describe()),
    );
    let (id, _) = ctx.start_sleeper(&mut b)?;
    let out = ctx.rt.run(&[
        "exec",
        "--cap",
        "CAP_NOPE",
        "--cap",
        "CAP_KILL",
        &id,
        "/bin/true",
    ])?;
    ctx.check_ok("exec with an unknown --cap runs", &out);
    let warning =
        "ignoring unknown or unavailable capabilities: [CAP_BOGUS CAP_NOPE SYS_ADMIN cap_kill]";
    ctx.check(
        "exec warns once about the config's and the flags' names",
        out.stderr.matches(warning).count() == 1,
        || format!("want {warning:?} once on stderr, got {}", out.describe()),
    );
    ctx.rt.quiet(&["delete", "--force", &id]);
    Ok(())
}
