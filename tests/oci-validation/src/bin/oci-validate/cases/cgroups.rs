//! linux.resources and cgroupsPath: seen from inside the container and from
//! the host, and changed with `update`.

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use oci_validation::expect::{Check, Expectations};
use serde_json::json;

use super::{CaseFn, Ctx};
use crate::bundle::Bundle;
use crate::report::Outcome;

pub const CASES: &[(&str, CaseFn)] = &[
    ("cgroups-inside", inside),
    ("cgroups-host", host),
    ("cgroups-update-values", update_values),
    ("cgroups-oom-killer", oom_killer),
];

/// One cgroup interface file: v1 controller, v1 file and value, v2 file and
/// value (runc's conversions for cgroup v2).
type Limit = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

const LIMITS: &[Limit] = &[
    (
        "memory",
        "memory.limit_in_bytes",
        "67108864",
        "memory.max",
        "67108864",
    ),
    (
        "memory",
        "memory.soft_limit_in_bytes",
        "33554432",
        "memory.low",
        "33554432",
    ),
    (
        "memory",
        "memory.memsw.limit_in_bytes",
        "100663296",
        "memory.swap.max",
        "33554432",
    ),
    ("cpu", "cpu.shares", "512", "cpu.weight", "20"),
    (
        "cpu",
        "cpu.cfs_quota_us",
        "50000",
        "cpu.max",
        "50000 100000",
    ),
    (
        "cpu",
        "cpu.cfs_period_us",
        "100000",
        "cpu.max",
        "50000 100000",
    ),
    ("cpuset", "cpuset.cpus", "0", "cpuset.cpus", "0"),
    ("cpuset", "cpuset.mems", "0", "cpuset.mems", "0"),
    ("pids", "pids.max", "64", "pids.max", "64"),
];

/// Whether the host accounts swap (cgroup v1 without swap accounting has no
/// memsw files, and runc cannot set memory.swap there).
pub(super) fn swap_supported() -> bool {
    match host_mount(Some("memory")) {
        Some(m) => m.join("memory.memsw.limit_in_bytes").exists(),
        None => true,
    }
}

/// The limits this host can apply; the others are recorded as skipped.
fn applicable(ctx: &mut Ctx, prefix: &str, limits: &'static [Limit]) -> Vec<&'static Limit> {
    let swap = swap_supported();
    let mut out = Vec::new();
    for l in limits {
        if !swap && l.1.contains("memsw") {
            ctx.record(
                format!("{prefix}{} = {}", l.1, l.2),
                Outcome::Skip("the host kernel does not account swap".into()),
            );
        } else {
            out.push(l);
        }
    }
    out
}

fn resources(b: &mut Bundle, cgroups_path: &str) {
    b.set("/linux/cgroupsPath", json!(cgroups_path));
    let memory = match swap_supported() {
        true => json!({"limit": 67108864, "reservation": 33554432, "swap": 100663296}),
        false => json!({"limit": 67108864, "reservation": 33554432}),
    };
    b.set("/linux/resources/memory", memory);
    b.set(
        "/linux/resources/cpu",
        json!({"shares": 512, "quota": 50000, "period": 100000, "cpus": "0", "mems": "0"}),
    );
    b.set("/linux/resources/pids", json!({"limit": 64}));
}

fn inside(ctx: &mut Ctx) -> Result<()> {
    let id = ctx.id();
    let mut b = ctx.bundle()?;
    resources(&mut b, &ctx.cgroup_path(&id));
    let mut e = Expectations::default();
    for (ctrl, f1, v1, f2, v2) in applicable(ctx, "", LIMITS) {
        e.push(
            format!("{f1} = {v1}"),
            Check::Cgroup {
                v1_controller: (*ctrl).into(),
                v1_file: (*f1).into(),
                v1_value: (*v1).into(),
                v2_file: (*f2).into(),
                v2_value: (*v2).into(),
            },
        );
    }
    ctx.run_checker_as(&b, &e, &id)?;
    Ok(())
}

/// Where the host mounts a v1 controller (`Some`) or cgroup2 (`None`).
pub(super) fn host_mount(controller: Option<&str>) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let target = pre.split(' ').nth(4)?;
        let mut post = post.split(' ');
        let fstype = post.next()?;
        let opts = post.nth(1).unwrap_or("");
        let hit = match controller {
            Some(c) => fstype == "cgroup" && opts.split(',').any(|o| o == c),
            None => fstype == "cgroup2",
        };
        hit.then(|| PathBuf::from(target))
    })
}

/// The cgroup of `pid` for a v1 controller (`Some`) or v2 (`None`).
fn proc_cgroup(pid: i32, controller: Option<&str>) -> Result<Option<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .with_context(|| format!("read /proc/{pid}/cgroup"))?;
    Ok(text.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let hit = match controller {
            Some(c) => ctrls.split(',').any(|x| x == c),
            None => ctrls.is_empty(),
        };
        hit.then(|| path.to_string())
    }))
}

/// Reads a limit of `pid`'s cgroup from the host: v1 when the host has the
/// controller as v1, else v2. Returns the file and (got, want).
fn host_limit(pid: i32, l: &Limit) -> Result<(PathBuf, String, String)> {
    let (ctrl, f1, v1, f2, v2) = *l;
    let (mnt, path, file, want) = match (host_mount(Some(ctrl)), proc_cgroup(pid, Some(ctrl))?) {
        (Some(m), Some(p)) => (m, p, f1, v1),
        _ => {
            let m = host_mount(None).ok_or_else(|| anyhow!("no cgroup mount for {ctrl}"))?;
            let p = proc_cgroup(pid, None)?.ok_or_else(|| anyhow!("pid {pid} has no v2 cgroup"))?;
            (m, p, f2, v2)
        }
    };
    let f = mnt.join(path.trim_start_matches('/')).join(file);
    let got = std::fs::read_to_string(&f).with_context(|| format!("read {}", f.display()))?;
    Ok((f, got.trim().to_string(), want.to_string()))
}

fn check_limits(ctx: &mut Ctx, pid: i32, limits: &'static [Limit], prefix: &str) {
    for l in applicable(ctx, prefix, limits) {
        let name = format!("{prefix}{} = {}", l.1, l.2);
        match host_limit(pid, l) {
            Ok((f, got, want)) => {
                ctx.check(&name, got == want, || {
                    format!("{} is {got:?}, want {want:?}", f.display())
                });
            }
            Err(e) => {
                ctx.check(&name, false, || format!("{e:#}"));
            }
        }
    }
}

fn host(ctx: &mut Ctx) -> Result<()> {
    let id = ctx.id();
    let cg = ctx.cgroup_path(&id);
    let mut b = ctx.bundle()?;
    resources(&mut b, &cg);
    let pid = ctx.start_sleeper_as(&mut b, &id)?;
    for ctrl in ["memory", "cpu", "cpuset", "pids", "devices", "freezer"] {
        if host_mount(Some(ctrl)).is_none() {
            continue;
        }
        let got = proc_cgroup(pid, Some(ctrl))?;
        ctx.check(
            format!("init in cgroupsPath ({ctrl})"),
            got.as_deref() == Some(cg.as_str()),
            || format!("/proc/{pid}/cgroup says {got:?}, want {cg}"),
        );
    }
    check_limits(ctx, pid, LIMITS, "host ");
    let mut args = vec!["update", "--memory", "134217728"];
    if swap_supported() {
        args.extend_from_slice(&["--memory-swap", "201326592"]);
    }
    args.extend_from_slice(&["--pids-limit", "128", "--cpu-share", "256", &id]);
    let out = ctx.rt.run(&args)?;
    if ctx.check_ok("update succeeds", &out) {
        const UPDATED: &[Limit] = &[
            (
                "memory",
                "memory.limit_in_bytes",
                "134217728",
                "memory.max",
                "134217728",
            ),
            (
                "memory",
                "memory.memsw.limit_in_bytes",
                "201326592",
                "memory.swap.max",
                "67108864",
            ),
            ("pids", "pids.max", "128", "pids.max", "128"),
            ("cpu", "cpu.shares", "256", "cpu.weight", "10"),
        ];
        check_limits(ctx, pid, UPDATED, "after update ");
    }
    let dirs: Vec<PathBuf> = ["memory", "pids"]
        .iter()
        .filter_map(|c| host_mount(Some(c)))
        .map(|m| m.join(cg.trim_start_matches('/')))
        .collect();
    let out = ctx.rt.run(&["delete", "--force", &id])?;
    ctx.check_ok("delete --force succeeds", &out);
    let left: Vec<&PathBuf> = dirs.iter().filter(|d| d.exists()).collect();
    ctx.check("cgroup removed on delete", left.is_empty(), || {
        format!("still there: {left:?}")
    });
    Ok(())
}

/// `update` takes runc's values: go-units sizes (`48MiB`, `0.0625g`) and
/// `-1` for unlimited; a bad size is refused.
fn update_values(ctx: &mut Ctx) -> Result<()> {
    let id = ctx.id();
    let cg = ctx.cgroup_path(&id);
    let mut b = ctx.bundle()?;
    b.set("/linux/cgroupsPath", json!(cg));
    b.set("/linux/resources/memory", json!({"limit": 67108864}));
    b.set(
        "/linux/resources/cpu",
        json!({"quota": 50000, "period": 100000}),
    );
    b.set("/linux/resources/pids", json!({"limit": 64}));
    let pid = ctx.start_sleeper_as(&mut b, &id)?;
    let steps: &[(&[&str], &'static [Limit])] = &[
        (
            &["--memory", "48MiB"],
            &[(
                "memory",
                "memory.limit_in_bytes",
                "50331648",
                "memory.max",
                "50331648",
            )],
        ),
        (
            &["--memory", "0.0625g"],
            &[(
                "memory",
                "memory.limit_in_bytes",
                "67108864",
                "memory.max",
                "67108864",
            )],
        ),
        (
            &["--memory", "-1"],
            &[(
                "memory",
                "memory.limit_in_bytes",
                "9223372036854771712",
                "memory.max",
                "max",
            )],
        ),
        (
            &["--pids-limit", "-1"],
            &[("pids", "pids.max", "max", "pids.max", "max")],
        ),
        (
            &["--cpu-quota", "-1"],
            &[("cpu", "cpu.cfs_quota_us", "-1", "cpu.max", "max 100000")],
        ),
    ];
    for (flags, limits) in steps {
        let mut args = vec!["update"];
        args.extend_from_slice(flags);
        args.push(&id);
        let what = flags.join(" ");
        let out = ctx.rt.run(&args)?;
        if ctx.check_ok(&format!("update {what} succeeds"), &out) {
            check_limits(ctx, pid, limits, &format!("{what}: "));
        }
    }
    for bad in ["lots", "-2", "1.5.3", "12x"] {
        let out = ctx.rt.run(&["update", "--memory", bad, &id])?;
        ctx.check(
            format!("update --memory {bad} refused"),
            out.code == Some(1) && out.stderr.contains("invalid value for memory"),
            || out.describe(),
        );
    }
    Ok(())
}

/// The `oom_kill_disable` line of `pid`'s v1 memory cgroup, read on the
/// host; `None` when the host has no v1 memory hierarchy.
fn oom_kill_disable(pid: i32) -> Result<Option<String>> {
    let (Some(mnt), Some(path)) = (
        host_mount(Some("memory")),
        proc_cgroup(pid, Some("memory"))?,
    ) else {
        return Ok(None);
    };
    let f = mnt
        .join(path.trim_start_matches('/'))
        .join("memory.oom_control");
    let text = std::fs::read_to_string(&f).with_context(|| format!("read {}", f.display()))?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill_disable "))
        .map(|v| v.trim().to_string()))
}

/// `linux.resources.memory.disableOOMKiller` writes `1` to the v1
/// `memory.oom_control` (runc ignores it on cgroup v2), and `update` keeps
/// it; without it the OOM killer stays on.
fn oom_killer(ctx: &mut Ctx) -> Result<()> {
    if host_mount(Some("memory")).is_none() {
        for name in [
            "disableOOMKiller: oom_kill_disable 1",
            "after update: oom_kill_disable 1",
            "without disableOOMKiller: oom_kill_disable 0",
        ] {
            ctx.record(
                name,
                Outcome::Skip("the host has no v1 memory cgroup".into()),
            );
        }
        return Ok(());
    }
    for (disable, name) in [
        (true, "disableOOMKiller: oom_kill_disable 1"),
        (false, "without disableOOMKiller: oom_kill_disable 0"),
    ] {
        let id = ctx.id();
        let mut b = ctx.bundle()?;
        b.set("/linux/cgroupsPath", json!(ctx.cgroup_path(&id)));
        b.set(
            "/linux/resources/memory",
            json!({"limit": 67108864, "disableOOMKiller": disable}),
        );
        let pid = ctx.start_sleeper_as(&mut b, &id)?;
        let want = if disable { "1" } else { "0" };
        let got = oom_kill_disable(pid)?;
        ctx.check(name, got.as_deref() == Some(want), || {
            format!("oom_kill_disable is {got:?}")
        });
        if disable {
            let out = ctx.rt.run(&["update", "--memory", "134217728", &id])?;
            let got = oom_kill_disable(pid)?;
            ctx.check(
                "after update: oom_kill_disable 1",
                out.success() && got.as_deref() == Some("1"),
                || format!("update: {}; oom_kill_disable is {got:?}", out.describe()),
            );
        }
        ctx.rt.quiet(&["delete", "--force", &id]);
    }
    Ok(())
}
