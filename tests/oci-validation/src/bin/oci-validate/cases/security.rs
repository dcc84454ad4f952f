//! seccomp, sysctl, oomScoreAdj, and LSM fields on a host without LSMs.

use std::path::Path;

use anyhow::Result;
use oci_validation::expect::{Check, Expectations, Probe};
use serde_json::json;

use super::{CaseFn, Ctx};
use crate::report::Outcome;

pub const CASES: &[(&str, CaseFn)] = &[
    ("seccomp", seccomp),
    ("sysctl", sysctl),
    ("oom-score-adj", oom_score_adj),
    ("lsm-disabled", lsm_disabled),
];

fn syscall(probe: Probe, errno: Option<i32>) -> Check {
    Check::Syscall { probe, errno }
}

fn seccomp(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.set(
        "/linux/seccomp",
        json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            "syscalls": [
                {"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EXDEV},
                {"names": ["getppid"], "action": "SCMP_ACT_ERRNO"},
                {"names": ["getpgid"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOTTY,
                 "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ"}]},
                {"names": ["getpgid"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EDOM,
                 "args": [{"index": 0, "value": 256, "valueTwo": 256, "op": "SCMP_CMP_MASKED_EQ"}]},
                {"names": ["getsid"], "action": "SCMP_ACT_TRACE"},
                {"names": ["sethostname"], "action": "SCMP_ACT_KILL"}
            ]
        }),
    );
    let mut e = Expectations::default();
    e.push(
        "filter installed (Seccomp: 2)",
        Check::Status {
            field: "Seccomp".into(),
            value: "2".into(),
        },
    );
    e.push(
        "errnoRet returned by mkdir",
        syscall(
            Probe::Mkdir {
                path: "/tmp/denied".into(),
            },
            Some(libc::EXDEV),
        ),
    );
    e.push(
        "SCMP_ACT_ERRNO defaults to EPERM",
        syscall(Probe::Getppid, Some(libc::EPERM)),
    );
    e.push(
        "SCMP_CMP_EQ argument matched",
        syscall(Probe::Getpgid { pid: 1 }, Some(libc::ENOTTY)),
    );
    e.push(
        "other argument values allowed",
        syscall(Probe::Getpgid { pid: 0 }, None),
    );
    e.push(
        "SCMP_CMP_MASKED_EQ argument matched",
        syscall(Probe::Getpgid { pid: 256 }, Some(libc::EDOM)),
    );
    e.push(
        "SCMP_ACT_TRACE without a tracer gives ENOSYS",
        syscall(Probe::Getsid { pid: 0 }, Some(libc::ENOSYS)),
    );
    e.push(
        "SCMP_ACT_KILL kills with SIGSYS",
        Check::KilledBy {
            probe: Probe::Sethostname { name: "x".into() },
            signal: libc::SIGSYS,
        },
    );
    e.push(
        "unlisted syscalls allowed",
        syscall(
            Probe::WriteFile {
                path: "/tmp/allowed".into(),
            },
            None,
        ),
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

const SYSCTLS: &[(&str, &str)] = &[
    ("net.ipv4.ip_forward", "1"),
    ("net.core.somaxconn", "512"),
    ("kernel.shm_rmid_forced", "1"),
    ("kernel.msgmax", "16384"),
    ("kernel.domainname", "oci.example"),
];

fn sysctl_path(key: &str) -> String {
    format!("/proc/sys/{}", key.replace('.', "/"))
}

fn sysctl(ctx: &mut Ctx) -> Result<()> {
    let host_before: Vec<Option<String>> = SYSCTLS
        .iter()
        .map(|(k, _)| std::fs::read_to_string(sysctl_path(k)).ok())
        .collect();
    let mut b = ctx.bundle()?;
    let map: serde_json::Map<String, serde_json::Value> = SYSCTLS
        .iter()
        .map(|(k, v)| ((*k).to_string(), json!(v)))
        .collect();
    b.set("/linux/sysctl", serde_json::Value::Object(map));
    let mut e = Expectations::default();
    for (k, v) in SYSCTLS {
        e.push(
            format!("{k} = {v}"),
            Check::FileContent {
                path: sysctl_path(k),
                content: (*v).into(),
            },
        );
    }
    ctx.run_checker(&b, &e)?;
    for ((k, _), before) in SYSCTLS.iter().zip(host_before) {
        let after = std::fs::read_to_string(sysctl_path(k)).ok();
        ctx.check(format!("host {k} untouched"), before == after, || {
            format!("host value changed from {before:?} to {after:?}")
        });
    }
    Ok(())
}

fn oom_score_adj(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.set("/process/oomScoreAdj", json!(500));
    let mut e = Expectations::default();
    e.push(
        "oomScoreAdj 500",
        Check::FileContent {
            path: "/proc/self/oom_score_adj".into(),
            content: "500".into(),
        },
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

/// On a host without AppArmor or SELinux, runc refuses a container that asks
/// for a profile or label rather than run it unconfined.
fn lsm_disabled(ctx: &mut Ctx) -> Result<()> {
    let apparmor = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y");
    let selinux = Path::new("/sys/fs/selinux/enforce").exists();
    let refused = |ctx: &mut Ctx, name: &str, fields: &[(&str, serde_json::Value)]| -> Result<()> {
        let mut b = ctx.bundle()?;
        for (ptr, v) in fields {
            b.set(ptr, v.clone());
        }
        b.args(&["/bin/true"]);
        b.write()?;
        let id = ctx.id();
        let res = ctx.rt.run(&["run", "--bundle", &b.dir_str(), &id])?;
        ctx.check_refused(name, &res);
        Ok(())
    };
    let aa = "apparmorProfile refused when AppArmor is off";
    if apparmor {
        ctx.record(aa, Outcome::Skip("AppArmor is enabled on this host".into()));
    } else {
        refused(
            ctx,
            aa,
            &[("/process/apparmorProfile", json!("oci-validate"))],
        )?;
    }
    let se = "selinuxLabel refused when SELinux is off";
    if selinux {
        ctx.record(se, Outcome::Skip("SELinux is enabled on this host".into()));
    } else {
        refused(
            ctx,
            se,
            &[(
                "/process/selinuxLabel",
                json!("system_u:system_r:container_t:s0:c1,c2"),
            )],
        )?;
    }
    Ok(())
}
