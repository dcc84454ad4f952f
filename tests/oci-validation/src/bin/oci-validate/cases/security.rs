//! seccomp, sysctl, oomScoreAdj, and LSM fields on a host without LSMs.

use std::path::Path;

use anyhow::Result;
use oci_validation::expect::{Check, Expectations, Probe};
use oci_validation::CHECKER_PATH;
use serde_json::{json, Value};

use super::{CaseFn, Ctx};
use crate::bundle::{set_mode, DEFAULT_CAPS};
use crate::report::Outcome;

pub const CASES: &[(&str, CaseFn)] = &[
    ("seccomp", seccomp),
    ("seccomp-default-profile", default_profile),
    ("seccomp-enosys", enosys),
    ("seccomp-without-no-new-privs", without_no_new_privs),
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

/// A profile that denies mkdir with EXDEV and allows everything else.
fn mkdir_profile() -> Value {
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [
            {"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EXDEV}
        ]
    })
}

/// The checks of a process under [`mkdir_profile`] without no_new_privs,
/// with the default capabilities and no more: the filter is on, no_new_privs
/// is not, and CAP_SYS_ADMIN (which the runtime holds while it installs the
/// filter) is gone from every set.
fn filter_without_nnp(e: &mut Expectations, who: &str, default_caps: u64) {
    e.push(
        format!("{who}: filter installed (Seccomp: 2)"),
        Check::Status {
            field: "Seccomp".into(),
            value: "2".into(),
        },
    );
    e.push(
        format!("{who}: no_new_privs left off (NoNewPrivs: 0)"),
        Check::Status {
            field: "NoNewPrivs".into(),
            value: "0".into(),
        },
    );
    e.push(
        format!("{who}: the filter denies mkdir"),
        syscall(
            Probe::Mkdir {
                path: "/tmp/denied".into(),
            },
            Some(libc::EXDEV),
        ),
    );
    for (field, what) in [
        ("CapBnd", "bounding"),
        ("CapEff", "effective"),
        ("CapPrm", "permitted"),
    ] {
        e.push(
            format!("{who}: {what} capabilities are the process's, no CAP_SYS_ADMIN"),
            Check::CapSet {
                field: field.into(),
                mask: default_caps,
            },
        );
    }
}

/// A seccomp profile without no_new_privs, the way Docker and Podman run
/// every container and every `exec`: installing a filter then needs
/// CAP_SYS_ADMIN, which runc holds until the filter is on and drops after.
/// `noNewPrivileges: false` reads as no field at all; an exec'd process
/// gets the container's filter without no_new_privs, so a set-uid program
/// works in it (`sudo` in `docker exec -u 1000`).
fn without_no_new_privs(ctx: &mut Ctx) -> Result<()> {
    let default_caps = oci_validation::caps::mask(DEFAULT_CAPS).map_err(anyhow::Error::msg)?;
    let mut b = ctx.bundle()?;
    b.set("/linux/seccomp", mkdir_profile());
    b.set("/process/noNewPrivileges", json!(false));
    let mut e = Expectations::default();
    filter_without_nnp(&mut e, "noNewPrivileges false", default_caps);
    ctx.run_checker(&b, &e)?;

    let mut b = ctx.bundle()?;
    b.set("/linux/seccomp", mkdir_profile());
    b.remove("/process", "noNewPrivileges");
    // The checker again, set-uid root: it runs as root whoever starts it,
    // unless no_new_privs is on.
    const SUID_CHECKER: &str = "/oci-checker-suid";
    let suid = b.rootfs().join(SUID_CHECKER.trim_start_matches('/'));
    std::fs::copy(b.rootfs().join(CHECKER_PATH.trim_start_matches('/')), &suid)?;
    set_mode(&suid, 0o4755)?;
    let (id, _pid) = ctx.start_sleeper(&mut b)?;
    let mut e = Expectations::default();
    filter_without_nnp(&mut e, "exec", default_caps);
    ctx.exec_checker(&b, &id, &e, &[])?;
    let mut e = Expectations::default();
    e.push(
        "exec --user 1000 of a set-uid root program runs as euid 0",
        Check::Status {
            field: "Uid".into(),
            value: "1000\t0\t0\t0".into(),
        },
    );
    e.push(
        "exec --user 1000 of a set-uid root program: its filter denies mkdir",
        syscall(
            Probe::Mkdir {
                path: "/tmp/denied-suid".into(),
            },
            Some(libc::EXDEV),
        ),
    );
    ctx.exec_checker_at(&b, &id, &e, &["--user", "1000:1000"], SUID_CHECKER)?;
    let res = ctx.rt.run(&["kill", &id, "KILL"])?;
    ctx.check_ok("kill of the container succeeds", &res);
    Ok(())
}

/// Podman's default profile (containers-common), in the Docker profile
/// format with `includes`/`excludes`.
const CONTAINERS_PROFILE: &str = "/usr/share/containers/seccomp.json";

/// A Docker-format profile as Docker and Podman hand it to runc for an
/// amd64 container with capabilities `caps`: rules whose `includes` the
/// container does not meet or whose `excludes` it does are dropped, the
/// architectures are the amd64 entry of `archMap` with its
/// sub-architectures, and the format's own fields go.
fn oci_profile(docker: &Value, caps: &[&str]) -> Value {
    let has = |v: &Value, key: &str, f: &dyn Fn(&str) -> bool| {
        v.get(key).and_then(Value::as_array).map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(f)
                .collect::<Vec<_>>()
        })
    };
    let mut syscalls = Vec::new();
    for rule in docker["syscalls"].as_array().into_iter().flatten() {
        let inc = &rule["includes"];
        let exc = &rule["excludes"];
        let caps_in = |c: &str| caps.contains(&c);
        let amd64 = |a: &str| a == "amd64";
        let included = has(inc, "caps", &caps_in).is_none_or(|v| v.iter().all(|b| *b))
            && has(inc, "arches", &amd64).is_none_or(|v| v.is_empty() || v.iter().any(|b| *b));
        let excluded = has(exc, "caps", &caps_in).is_some_and(|v| v.iter().any(|b| *b))
            || has(exc, "arches", &amd64).is_some_and(|v| v.iter().any(|b| *b));
        if !included || excluded {
            continue;
        }
        let mut r = rule.clone();
        if let Some(o) = r.as_object_mut() {
            for k in ["includes", "excludes", "comment", "errno"] {
                o.remove(k);
            }
        }
        syscalls.push(r);
    }
    let arches: Vec<Value> = docker["archMap"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["architecture"] == "SCMP_ARCH_X86_64")
        .flat_map(|m| {
            let mut v = vec![m["architecture"].clone()];
            v.extend(
                m["subArchitectures"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
            v
        })
        .collect();
    json!({
        "defaultAction": docker["defaultAction"],
        "defaultErrnoRet": docker["defaultErrnoRet"],
        "architectures": arches,
        "syscalls": syscalls,
    })
}

/// Podman's default profile as it hands it to runc for a container with
/// the default capabilities; `None`, with `checks` skipped, where this
/// host has no such file.
fn containers_profile(ctx: &mut Ctx, checks: &[&str]) -> Result<Option<Value>> {
    let text = match std::fs::read_to_string(CONTAINERS_PROFILE) {
        Ok(t) => t,
        Err(e) => {
            ctx.skip_all(checks, &format!("{CONTAINERS_PROFILE}: {e}"));
            return Ok(None);
        }
    };
    let docker: Value = serde_json::from_str(&text)?;
    Ok(Some(oci_profile(&docker, crate::bundle::DEFAULT_CAPS)))
}

/// The default profile Podman gives runc loads, and the workload runs
/// under it: a profile with `defaultErrnoRet`, sub-architectures, rules
/// with argument filters (`personality`, `socket`, `clone`) and names
/// libseccomp may not know.
fn default_profile(ctx: &mut Ctx) -> Result<()> {
    const CHECKS: &[&str] = &[
        "default profile loaded (Seccomp: 2)",
        "allowed syscalls work under it",
        "unlisted syscall gets defaultErrnoRet",
    ];
    let Some(profile) = containers_profile(ctx, CHECKS)? else {
        return Ok(());
    };
    let default_errno = profile["defaultErrnoRet"]
        .as_i64()
        .and_then(|e| i32::try_from(e).ok())
        .unwrap_or(libc::EPERM);
    let mut b = ctx.bundle()?;
    b.set("/linux/seccomp", profile);
    let mut e = Expectations::default();
    e.push(
        CHECKS[0],
        Check::Status {
            field: "Seccomp".into(),
            value: "2".into(),
        },
    );
    e.push(
        CHECKS[1],
        syscall(
            Probe::WriteFile {
                path: "/tmp/allowed".into(),
            },
            None,
        ),
    );
    // add_key is left out of the profile: the default action answers.
    e.push(CHECKS[2], syscall(Probe::AddKey, Some(default_errno)));
    ctx.run_checker(&b, &e)?;
    Ok(())
}

/// x86-64 system calls numbered from clone3 (435, Linux 5.3) on, which
/// [`enosys`] takes out of the default profile.
const NEWER: &[&str] = &[
    "clone3",
    "close_range",
    "openat2",
    "pidfd_getfd",
    "faccessat2",
    "process_madvise",
    "epoll_pwait2",
    "mount_setattr",
    "quotactl_fd",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
    "memfd_secret",
    "process_mrelease",
    "futex_waitv",
    "set_mempolicy_home_node",
    "cachestat",
    "fchmodat2",
    "map_shadow_stack",
    "futex_wake",
    "futex_wait",
    "futex_requeue",
    "statmount",
    "listmount",
    "lsm_get_self_attr",
    "lsm_set_self_attr",
    "lsm_list_modules",
    "mseal",
    "setxattrat",
    "getxattrat",
    "listxattrat",
    "removexattrat",
    "open_tree_attr",
];

/// A profile older than the kernel: Podman's default, with Docker's EPERM
/// for what it leaves out, without the system calls of Linux 5.3 and
/// later. runc answers a call numbered above the
/// highest the profile names with ENOSYS (so that glibc and others fall
/// back to an older call), and one below it that the profile leaves out
/// with the default action. (Should the profile name a newer call this
/// case does not know, runc's column fails and says so.)
fn enosys(ctx: &mut Ctx) -> Result<()> {
    const CHECKS: &[&str] = &[
        "a syscall newer than the profile gets ENOSYS",
        "an older syscall left out gets the default action",
    ];
    let Some(mut profile) = containers_profile(ctx, CHECKS)? else {
        return Ok(());
    };
    // Podman's default answers ENOSYS itself (defaultErrnoRet 38), where
    // runc adds nothing; Docker's answers EPERM, as this one now does.
    if let Some(p) = profile.as_object_mut() {
        p.remove("defaultErrnoRet");
    }
    if let Some(rules) = profile["syscalls"].as_array_mut() {
        for rule in rules.iter_mut() {
            if let Some(names) = rule["names"].as_array_mut() {
                names.retain(|n| n.as_str().is_none_or(|n| !NEWER.contains(&n)));
            }
        }
        rules.retain(|r| r["names"].as_array().is_some_and(|n| !n.is_empty()));
    }
    let mut b = ctx.bundle()?;
    b.set("/linux/seccomp", profile);
    let mut e = Expectations::default();
    e.push(CHECKS[0], syscall(Probe::Faccessat2, Some(libc::ENOSYS)));
    e.push(CHECKS[1], syscall(Probe::AddKey, Some(libc::EPERM)));
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
