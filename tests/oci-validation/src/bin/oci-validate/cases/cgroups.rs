//! linux.resources and cgroupsPath: seen from inside the container and from
//! the host, and changed with `update`.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
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
    ("cgroups-exec", exec_cgroup),
    ("cgroups-delete-children", delete_children),
    ("cgroups-preexisting", preexisting),
    ("cgroups-default-path", default_path),
    ("cgroups-unified", unified),
    ("cgroups-comounted-ns", comounted_ns),
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
        ctx.skip_all(
            &[
                "disableOOMKiller: oom_kill_disable 1",
                "after update: oom_kill_disable 1",
                "without disableOOMKiller: oom_kill_disable 0",
            ],
            "the host has no v1 memory cgroup",
        );
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

/// The hierarchies of `pid` as `/proc/PID/cgroup` lists them: (controllers
/// as written, path), sorted.
fn memberships(pid: i32) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .with_context(|| format!("read /proc/{pid}/cgroup"))?;
    let mut v: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
            Some((ctrls.to_string(), path.to_string()))
        })
        .collect();
    v.sort();
    Ok(v)
}

/// The directory of a hierarchy (controllers as `/proc/PID/cgroup` writes
/// them, empty for the unified one) at `path`.
fn hierarchy_dir(controllers: &str, path: &str) -> Option<PathBuf> {
    let mnt = match controllers {
        "" => host_mount(None),
        c => host_mount(Some(c.split(',').next().unwrap_or(c))),
    }?;
    Some(mnt.join(path.trim_start_matches('/')))
}

/// Starts `args` with `exec -d --pid-file` plus `opts`; returns its host
/// pid, or the failed command's description.
fn exec_detached(ctx: &mut Ctx, id: &str, opts: &[&str]) -> Result<Result<i32, String>> {
    let dir = ctx.scratch("exec-pid")?;
    let pid_file = dir.join("pid").to_string_lossy().into_owned();
    let mut args = vec!["exec", "-d", "--pid-file", pid_file.as_str()];
    args.extend_from_slice(opts);
    args.extend_from_slice(&[id, "/bin/sleep", "600"]);
    let out = ctx.rt.run(&args)?;
    if !out.success() {
        return Ok(Err(out.describe()));
    }
    let pid = super::wait_file(std::path::Path::new(&pid_file))
        .and_then(|s| s.trim().parse::<i32>().ok());
    Ok(pid.ok_or_else(|| format!("no pid in {pid_file}")))
}

/// `exec` joins every cgroup of the container's init; `exec --cgroup`
/// (runc 1.1) moves the process into an existing sub-cgroup, of every
/// hierarchy or of the controllers named, and refuses a missing or
/// escaping sub-cgroup and malformed arguments.
fn exec_cgroup(ctx: &mut Ctx) -> Result<()> {
    let id = ctx.id();
    let cg = ctx.cgroup_path(&id);
    let mut b = ctx.bundle()?;
    b.set("/linux/cgroupsPath", json!(cg));
    let init = ctx.start_sleeper_as(&mut b, &id)?;
    let init_cgroups = memberships(init)?;
    let mut pids = Vec::new();
    let mut made = Vec::new();
    let result = exec_cgroup_checks(ctx, &id, &cg, &init_cgroups, &mut pids, &mut made);
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    crate::reaper::tick(std::time::Duration::from_millis(100));
    for d in made.iter().rev() {
        let _ = std::fs::remove_dir(d);
    }
    ctx.rt.quiet(&["delete", "--force", &id]);
    result
}

fn exec_cgroup_checks(
    ctx: &mut Ctx,
    id: &str,
    cg: &str,
    init_cgroups: &[(String, String)],
    pids: &mut Vec<i32>,
    made: &mut Vec<PathBuf>,
) -> Result<()> {
    match exec_detached(ctx, id, &[])? {
        Ok(pid) => {
            pids.push(pid);
            let got = memberships(pid)?;
            ctx.check(
                "exec joins every cgroup of the init",
                got == init_cgroups,
                || format!("exec in {got:?}, init in {init_cgroups:?}"),
            );
        }
        Err(e) => {
            ctx.check("exec joins every cgroup of the init", false, || e);
        }
    }
    let sub = format!("{cg}/sub");
    let Some(memory_sub) = hierarchy_dir("memory", &sub) else {
        ctx.record(
            "exec --cgroup memory:sub joins memory's sub-cgroup only",
            Outcome::Skip("the host has no v1 memory cgroup".into()),
        );
        return Ok(());
    };
    std::fs::create_dir(&memory_sub).with_context(|| format!("mkdir {}", memory_sub.display()))?;
    made.push(memory_sub);
    match exec_detached(ctx, id, &["--cgroup", "memory:sub"])? {
        Ok(pid) => {
            pids.push(pid);
            let got = memberships(pid)?;
            let want: Vec<(String, String)> = init_cgroups
                .iter()
                .map(|(c, p)| match c.split(',').any(|x| x == "memory") {
                    true => (c.clone(), sub.clone()),
                    false => (c.clone(), p.clone()),
                })
                .collect();
            ctx.check(
                "exec --cgroup memory:sub joins memory's sub-cgroup only",
                got == want,
                || format!("exec in {got:?}, want {want:?}"),
            );
        }
        Err(e) => {
            ctx.check(
                "exec --cgroup memory:sub joins memory's sub-cgroup only",
                false,
                || e,
            );
        }
    }
    let res = exec_detached(ctx, id, &["--cgroup", "sub"])?;
    if let Ok(pid) = res {
        pids.push(pid);
    }
    ctx.check(
        "exec --cgroup sub missing from other hierarchies refused",
        res.is_err(),
        || "the exec started".into(),
    );
    // Every hierarchy the init is in at cgroupsPath gets the sub-cgroup.
    for (c, p) in init_cgroups {
        if p == cg {
            if let Some(d) = hierarchy_dir(c, &sub).filter(|d| !d.exists()) {
                std::fs::create_dir(&d).with_context(|| format!("mkdir {}", d.display()))?;
                made.push(d.clone());
                // A new v1 cpuset has no cpus or mems: give it its parent's.
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    if let Some(parent) = d.parent().filter(|p| p.join(f).exists()) {
                        let v = std::fs::read_to_string(parent.join(f))?;
                        std::fs::write(d.join(f), v.trim())
                            .with_context(|| format!("write {}", d.join(f).display()))?;
                    }
                }
            }
        }
    }
    match exec_detached(ctx, id, &["--cgroup", "/sub"])? {
        Ok(pid) => {
            pids.push(pid);
            let got = memberships(pid)?;
            let want: Vec<(String, String)> = init_cgroups
                .iter()
                .map(|(c, p)| match p == cg {
                    true => (c.clone(), sub.clone()),
                    false => (c.clone(), p.clone()),
                })
                .collect();
            ctx.check(
                "exec --cgroup /sub joins it in every hierarchy",
                got == want,
                || format!("exec in {got:?}, want {want:?}"),
            );
        }
        Err(e) => {
            ctx.check(
                "exec --cgroup /sub joins it in every hierarchy",
                false,
                || e,
            );
        }
    }
    let refusals: &[(&str, &[&str], &str)] = &[
        (
            "escaping",
            &["--cgroup", "memory:../../x"],
            "is not a sub cgroup path",
        ),
        (
            "three parts",
            &["--cgroup", "a:b:c"],
            "invalid --cgroup argument: a:b:c",
        ),
        (
            "two without a controller",
            &["--cgroup", "sub", "--cgroup", "sub"],
            "missing <controller>: prefix",
        ),
        ("unknown controller", &["--cgroup", "bogus:sub"], "bogus"),
    ];
    for (what, opts, msg) in refusals {
        let res = exec_detached(ctx, id, opts)?;
        match res {
            Ok(pid) => {
                pids.push(pid);
                ctx.check(format!("exec --cgroup {what} refused"), false, || {
                    "the exec started".into()
                });
            }
            Err(e) => {
                ctx.check(
                    format!("exec --cgroup {what} refused"),
                    e.contains(msg),
                    || format!("want {msg:?} in: {e}"),
                );
            }
        }
    }
    Ok(())
}

/// A bundle whose workload may write its cgroups: `/sys` and the cgroup
/// mount read-write (the container has its own cgroup namespace).
fn writable_cgroups(ctx: &mut Ctx, id: &str) -> Result<crate::bundle::Bundle> {
    let mut b = ctx.bundle()?;
    b.set("/linux/cgroupsPath", json!(ctx.cgroup_path(id)));
    if let Some(mounts) = b.config["mounts"].as_array_mut() {
        for m in mounts.iter_mut() {
            if m["destination"] == "/sys" || m["destination"] == "/sys/fs/cgroup" {
                if let Some(opts) = m["options"].as_array_mut() {
                    opts.retain(|o| o != "ro");
                    opts.push(json!("rw"));
                }
            }
        }
    }
    Ok(b)
}

/// The container's cgroup directories (and below) left in any hierarchy.
fn cgroup_dirs_left(cg: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path().join(cg.trim_start_matches('/')))
        .filter(|d| d.is_dir())
        .collect()
}

/// `delete` and `delete --force` remove the cgroups the workload made
/// below the container's, as runc removes the whole tree.
fn delete_children(ctx: &mut Ctx) -> Result<()> {
    if host_mount(Some("memory")).is_none() || host_mount(Some("pids")).is_none() {
        ctx.skip_all(
            &[
                "delete --force removes child cgroups",
                "delete removes child cgroups",
                "run removes child cgroups at exit",
            ],
            "the host has no v1 memory and pids cgroups",
        );
        return Ok(());
    }
    const MAKE: &str = "mkdir -p /sys/fs/cgroup/memory/child/deeper /sys/fs/cgroup/pids/child && \
                        echo $$ > /sys/fs/cgroup/memory/child/deeper/cgroup.procs && \
                        echo $$ > /sys/fs/cgroup/pids/child/cgroup.procs";
    // Running, with its init in the children: delete --force.
    let id = ctx.id();
    let cg = ctx.cgroup_path(&id);
    let mut b = writable_cgroups(ctx, &id)?;
    b.args(&["/bin/sh", "-c", &format!("{MAKE} && exec sleep 600")]);
    b.write()?;
    let out = ctx.rt.run(&["run", "-d", "--bundle", &b.dir_str(), &id])?;
    if !out.success() {
        bail!("run -d: {}", out.describe());
    }
    let deeper = host_mount(Some("memory"))
        .map(|m| m.join(cg.trim_start_matches('/')).join("child/deeper"))
        .unwrap_or_default();
    let made = super::wait_file(&deeper.join("cgroup.procs")).is_some_and(|s| !s.trim().is_empty());
    if !made {
        bail!("the workload did not move into {}", deeper.display());
    }
    let out = ctx.rt.run(&["delete", "--force", &id])?;
    let left = cgroup_dirs_left(&cg);
    ctx.check(
        "delete --force removes child cgroups",
        out.success() && left.is_empty(),
        || format!("delete: {}; left: {left:?}", out.describe()),
    );
    // Stopped: the workload made children and exited; delete.
    let id = ctx.id();
    let cg = ctx.cgroup_path(&id);
    let mut b = writable_cgroups(ctx, &id)?;
    b.args(&["/bin/sh", "-c", MAKE]);
    b.write()?;
    let out = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    if !out.success() {
        bail!("create: {}", out.describe());
    }
    let out = ctx.rt.run(&["start", &id])?;
    if !out.success() {
        bail!("start: {}", out.describe());
    }
    if let Err(e) = ctx.wait_status(&id, "stopped") {
        bail!("the workload did not stop: {e}");
    }
    let before = cgroup_dirs_left(&cg);
    let out = ctx.rt.run(&["delete", &id])?;
    let left = cgroup_dirs_left(&cg);
    ctx.check(
        "delete removes child cgroups",
        !before.is_empty() && out.success() && left.is_empty(),
        || {
            format!(
                "before: {before:?}; delete: {}; left: {left:?}",
                out.describe()
            )
        },
    );
    // A foreground run deletes the container, children and all, at exit.
    let id = ctx.id();
    let cg = ctx.cgroup_path(&id);
    let mut b = writable_cgroups(ctx, &id)?;
    b.args(&["/bin/sh", "-c", MAKE]);
    b.write()?;
    let out = ctx.rt.run(&["run", "--bundle", &b.dir_str(), &id])?;
    let left = cgroup_dirs_left(&cg);
    ctx.check(
        "run removes child cgroups at exit",
        out.success() && left.is_empty(),
        || format!("run: {}; left: {left:?}", out.describe()),
    );
    Ok(())
}

/// Removes the cgroup at `cg` (and below) from every hierarchy, thawed.
fn remove_everywhere(cg: &str) {
    for d in cgroup_dirs_left(cg) {
        let _ = std::fs::write(d.join("freezer.state"), "THAWED");
        let mut all = vec![d.clone()];
        let mut i = 0;
        while i < all.len() {
            if let Ok(entries) = std::fs::read_dir(&all[i]) {
                all.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
            i += 1;
        }
        for d in all.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// `create` into a cgroup that already holds a process warns as runc 1.1
/// does and creates the container; into a frozen one it fails with runc's
/// error (the init would stay frozen) instead of hanging, leaving nothing.
fn preexisting(ctx: &mut Ctx) -> Result<()> {
    let (Some(devices), Some(freezer)) = (host_mount(Some("devices")), host_mount(Some("freezer")))
    else {
        ctx.skip_all(
            &[
                "create into a populated cgroup warns",
                "create into a frozen cgroup refused",
                "no container left after a frozen cgroup",
            ],
            "the host has no v1 devices and freezer cgroups",
        );
        return Ok(());
    };
    let id = ctx.id();
    let cg = ctx.cgroup_path(&id);
    let dir = devices.join(cg.trim_start_matches('/'));
    std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
    let mut stranger = std::process::Command::new("sleep").arg("600").spawn()?;
    crate::reaper::register(stranger.id());
    let moved = std::fs::write(dir.join("cgroup.procs"), stranger.id().to_string());
    let mut b = ctx.bundle()?;
    b.set("/linux/cgroupsPath", json!(cg));
    b.args(&["/bin/sleep", "600"]);
    b.write()?;
    let out = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    let _ = stranger.kill();
    let _ = stranger.wait();
    crate::reaper::unregister(stranger.id());
    moved.with_context(|| format!("move a process into {}", dir.display()))?;
    ctx.check(
        "create into a populated cgroup warns",
        out.success()
            && out
                .stderr
                .contains("container's cgroup is not empty: 1 process(es) found"),
        || out.describe(),
    );
    ctx.rt.quiet(&["delete", "--force", &id]);
    remove_everywhere(&cg);

    let id = ctx.id();
    let cg = ctx.cgroup_path(&id);
    let dir = freezer.join(cg.trim_start_matches('/'));
    std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
    std::fs::write(dir.join("freezer.state"), "FROZEN")
        .with_context(|| format!("freeze {}", dir.display()))?;
    let mut b = ctx.bundle()?;
    b.set("/linux/cgroupsPath", json!(cg));
    b.args(&["/bin/sleep", "600"]);
    b.write()?;
    let out = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    ctx.check(
        "create into a frozen cgroup refused",
        !out.timed_out
            && out.code.is_some_and(|c| c != 0)
            && out
                .stderr
                .contains("container's cgroup unexpectedly frozen"),
        || out.describe(),
    );
    let st = ctx.state(&id);
    ctx.check(
        "no container left after a frozen cgroup",
        st.is_err(),
        || super::show(&st),
    );
    ctx.rt.quiet(&["delete", "--force", &id]);
    remove_everywhere(&cg);
    Ok(())
}

/// The cgroup runc 1.1 gives a container whose spec has no cgroupsPath
/// (cgroupfs driver): named after the container, below the caller's own
/// cgroup of each v1 hierarchy (on a v2-only host, below the parent of the
/// caller's); `delete` removes it. Only the controller hierarchies are
/// compared: runc also joins `name=systemd` and, on a hybrid host, the
/// unified one, which libcontainer leaves alone (see README).
fn default_path(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.remove("/linux", "cgroupsPath");
    let (id, pid) = ctx.start_sleeper(&mut b)?;
    let own = memberships(std::process::id() as i32)?;
    // A hierarchy the host does not mount (one left behind, unmounted, by
    // whoever made it) gets no cgroup from runc either.
    let v1: Vec<&(String, String)> = own
        .iter()
        .filter(|(c, _)| !c.is_empty() && !c.starts_with("name="))
        .filter(|(c, _)| hierarchy_dir(c, "/").is_some())
        .collect();
    let wanted: Vec<(String, String)> = if v1.is_empty() {
        own.iter()
            .filter(|(c, _)| c.is_empty())
            .map(|(c, p)| {
                let parent = Path::new(p).parent().unwrap_or(Path::new("/"));
                (c.clone(), parent.join(&id).to_string_lossy().into_owned())
            })
            .collect()
    } else {
        v1.iter()
            .map(|(c, p)| {
                (
                    c.clone(),
                    Path::new(p).join(&id).to_string_lossy().into_owned(),
                )
            })
            .collect()
    };
    // runc places the container below the caller's cgroup hierarchy by
    // hierarchy; libcgroups takes one path for all, so a caller whose own
    // cgroups differ between hierarchies is checked under its own name.
    let uniform = v1.windows(2).all(|w| w[0].1 == w[1].1);
    let prefix = if uniform {
        "no cgroupsPath"
    } else {
        "no cgroupsPath, the caller's cgroups differ by hierarchy"
    };
    let got = memberships(pid)?;
    for (ctrls, want) in &wanted {
        let name = if ctrls.is_empty() {
            "unified"
        } else {
            ctrls.as_str()
        };
        let have = got.iter().find(|(c, _)| c == ctrls).map(|(_, p)| p.clone());
        ctx.check(
            format!("{prefix}: {name} cgroup is the caller's/ID"),
            have.as_deref() == Some(want.as_str()),
            || format!("init's {have:?}, want {want:?}"),
        );
    }
    let res = ctx.rt.run(&["delete", "--force", &id])?;
    ctx.check_ok("delete --force succeeds", &res);
    let left: Vec<PathBuf> = wanted
        .iter()
        .filter_map(|(c, p)| hierarchy_dir(c, p))
        .filter(|d| d.exists())
        .collect();
    ctx.check("delete removes the default cgroup", left.is_empty(), || {
        format!("left: {left:?}")
    });
    Ok(())
}

/// `linux.resources.unified` is cgroup v2's: runc 1.1 refuses it unless
/// `/sys/fs/cgroup` is the unified hierarchy (a hybrid host's
/// `/sys/fs/cgroup/unified` holds no controllers), and leaves nothing.
fn unified(ctx: &mut Ctx) -> Result<()> {
    const REFUSED: &str = "unified on a cgroup v1 host: refused as runc";
    const LEFT: &str = "no container left after the refusal";
    const APPLIED: &str = "unified on a cgroup v2 host: pids.max applied";
    let v2_host = host_mount(None).is_some_and(|m| m == Path::new("/sys/fs/cgroup"));
    let id = ctx.id();
    let mut b = ctx.bundle()?;
    b.set("/linux/cgroupsPath", json!(ctx.cgroup_path(&id)));
    b.set("/linux/resources/unified", json!({"pids.max": "10"}));
    if v2_host {
        ctx.skip_all(&[REFUSED, LEFT], "this host's /sys/fs/cgroup is cgroup v2");
        let mut e = Expectations::default();
        e.push(
            APPLIED,
            Check::Cgroup {
                v1_controller: "pids".into(),
                v1_file: "pids.max".into(),
                v1_value: "10".into(),
                v2_file: "pids.max".into(),
                v2_value: "10".into(),
            },
        );
        ctx.run_checker_as(&b, &e, &id)?;
        return Ok(());
    }
    ctx.record(
        APPLIED,
        Outcome::Skip("this host's /sys/fs/cgroup is not cgroup v2".into()),
    );
    b.args(&["/bin/sleep", "600"]);
    b.write()?;
    let out = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    ctx.check(
        REFUSED,
        out.code == Some(1)
            && out
                .stderr
                .contains("invalid configuration: cannot use unified on cgroup v1"),
        || out.describe(),
    );
    let st = ctx.state(&id);
    ctx.check(LEFT, st.is_err(), || super::show(&st));
    Ok(())
}

/// The host's cgroup v1 hierarchies below /sys/fs/cgroup: (directory,
/// mount options without `rw`).
fn v1_hierarchies() -> Vec<(String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let target = pre.split(' ').nth(4)?;
            let dir = target.strip_prefix("/sys/fs/cgroup/")?;
            let mut post = post.split(' ');
            (post.next()? == "cgroup" && !dir.contains('/')).then_some(())?;
            let opts: Vec<&str> = post
                .nth(1)
                .unwrap_or("")
                .split(',')
                .filter(|o| *o != "rw" && *o != "ro")
                .collect();
            Some((dir.to_string(), opts.join(",")))
        })
        .collect()
}

/// A host that co-mounts cgroup v1 controllers (`net_cls,net_prio`, as
/// systemd hosts do) and a container with its own cgroup namespace and a
/// read-only cgroup mount, with and without a user namespace: runc mounts
/// each hierarchy afresh in the container, its root the container's
/// cgroup, and links each co-mounted controller's name to its hierarchy.
/// Unless this host co-mounts them itself, the runtime runs in a mount
/// namespace of its own whose /sys/fs/cgroup is a fresh tmpfs with the
/// host's hierarchies mounted again and `net_cls,net_prio` together.
fn comounted_ns(ctx: &mut Ctx) -> Result<()> {
    const RUNS: &str = "run with a cgroup namespace succeeds";
    const ROOT: &str = "net_cls,net_prio is mounted with the container's cgroup as root";
    const OTHERS: &str = "the other hierarchies are mounted with the container's cgroup as root";
    const LINKS: &str = "net_cls and net_prio link to net_cls,net_prio";
    const SELF: &str = "the container is at / of net_cls,net_prio in /proc/self/cgroup";
    const RO: &str = "the co-mounted hierarchy is read-only";
    const LEFT: &str = "no cgroup left in the co-mounted hierarchy";
    const CHECKS: &[&str] = &[RUNS, ROOT, OTHERS, LINKS, SELF, RO, LEFT];
    const VARIANTS: &[&str] = &["", "in a user namespace: "];
    let all: Vec<String> = VARIANTS
        .iter()
        .flat_map(|v| CHECKS.iter().map(move |c| format!("{v}{c}")))
        .collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let v2_host = host_mount(None).is_some_and(|m| m == Path::new("/sys/fs/cgroup"));
    let hierarchies = v1_hierarchies();
    if v2_host || hierarchies.is_empty() {
        ctx.skip_all(&all, "this host has no cgroup v1 hierarchies");
        return Ok(());
    }
    let comounted = hierarchies.iter().any(|(d, _)| d == "net_cls,net_prio");
    let alone = hierarchies
        .iter()
        .any(|(_, o)| o.split(',').any(|c| c == "net_cls" || c == "net_prio"));
    if alone && !comounted {
        ctx.skip_all(
            &all,
            "this host mounts net_cls or net_prio without the other (the case needs them together)",
        );
        return Ok(());
    }
    const COMOUNT_FAILED: i32 = 97;
    const PROBE: &str = r#"while read -r _ _ _ root point _; do
  case "$point" in
    /sys/fs/cgroup/net_cls,net_prio) echo "root=$root" ;;
    /sys/fs/cgroup/memory) echo "memory-root=$root" ;;
  esac
done < /proc/self/mountinfo
echo "link-cls=$(readlink /sys/fs/cgroup/net_cls)"
echo "link-prio=$(readlink /sys/fs/cgroup/net_prio)"
while IFS=: read -r _ c p; do
  [ "$c" = net_cls,net_prio ] && echo "self=$p"
done < /proc/self/cgroup
if mkdir /sys/fs/cgroup/net_cls,net_prio/probe 2>/dev/null; then echo mkdir=made; else echo mkdir=refused; fi
"#;
    for (i, variant) in VARIANTS.iter().enumerate() {
        let id = ctx.id();
        let cg = ctx.cgroup_path(&id);
        let mut script = String::from("set -e\n");
        if !comounted {
            script.push_str("mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup\n");
            for (dir, opts) in &hierarchies {
                script.push_str(&format!(
                    "mkdir '/sys/fs/cgroup/{dir}'\n\
                     mount -t cgroup -o '{opts}' cgroup '/sys/fs/cgroup/{dir}'\n"
                ));
            }
            if host_mount(None).is_some_and(|m| m == Path::new("/sys/fs/cgroup/unified")) {
                script.push_str(
                    "mkdir /sys/fs/cgroup/unified\n\
                     mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified\n",
                );
            }
            script.push_str(&format!(
                "mkdir /sys/fs/cgroup/net_cls,net_prio\n\
                 mount -t cgroup -o net_cls,net_prio cgroup /sys/fs/cgroup/net_cls,net_prio \
                 || exit {COMOUNT_FAILED}\n\
                 ln -s net_cls,net_prio /sys/fs/cgroup/net_cls\n\
                 ln -s net_cls,net_prio /sys/fs/cgroup/net_prio\n"
            ));
        }
        // The runtime's exit, then what it left in the hierarchy the host
        // may not see (the harness removes the rest of /<tag> in each host
        // hierarchy at the end of the run).
        let here = format!("/sys/fs/cgroup/net_cls,net_prio{cg}");
        let parent = Path::new(&here)
            .parent()
            .unwrap_or(Path::new("/"))
            .display()
            .to_string();
        script.push_str(&format!(
            "set +e\n\"$@\"\nrc=$?\n\
             if [ -d '{here}' ]; then echo left=yes; rmdir '{here}'; else echo left=no; fi\n\
             {}exit $rc\n",
            if comounted {
                String::new()
            } else {
                format!("rmdir '{parent}' 2>/dev/null\n")
            }
        ));
        let mut b = ctx.bundle()?;
        b.set("/linux/cgroupsPath", json!(cg));
        b.push("/linux/namespaces", json!({"type": "cgroup"}));
        if i == 1 {
            super::user_namespace(&mut b);
        }
        b.args(&["/bin/sh", "-c", PROBE]);
        b.write()?;
        let wrapper = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ];
        let out = ctx
            .rt
            .run_via(&wrapper, &["run", "--bundle", &b.dir_str(), &id])?;
        if out.code == Some(COMOUNT_FAILED) {
            ctx.skip_all(
                &all,
                "the kernel would not mount net_cls and net_prio together (one is bound elsewhere)",
            );
            return Ok(());
        }
        let lines: Vec<&str> = out.stdout.lines().collect();
        let has = |l: &str| lines.contains(&l);
        let got = || out.describe() + " | stdout: " + &out.stdout.replace('\n', " ");
        let ran = out.success();
        let name = |c: &str| format!("{variant}{c}");
        ctx.check(name(RUNS), ran, got);
        ctx.check(name(ROOT), ran && has("root=/"), got);
        ctx.check(name(OTHERS), ran && has("memory-root=/"), got);
        ctx.check(
            name(LINKS),
            ran && has("link-cls=net_cls,net_prio") && has("link-prio=net_cls,net_prio"),
            got,
        );
        ctx.check(name(SELF), ran && has("self=/"), got);
        ctx.check(name(RO), ran && has("mkdir=refused"), got);
        ctx.check(name(LEFT), has("left=no"), got);
    }
    Ok(())
}
