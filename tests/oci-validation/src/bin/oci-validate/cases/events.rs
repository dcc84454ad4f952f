//! `events`: runc's stats JSON (`--stats`) and its `oom` events.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{json, Value};

use super::{CaseFn, Ctx};

pub const CASES: &[(&str, CaseFn)] = &[
    ("events-stats", stats),
    ("events-oom", oom),
    ("events-oom-init", oom_init),
];

/// A shell loop that grows a string until the OOM killer ends it.
const HOG: &str = "x=0123456789abcdef; while :; do x=$x$x; done";

/// A bundle whose memory cgroup (at `cgroupsPath`) allows 16 MiB.
fn limited(ctx: &mut Ctx, id: &str) -> Result<crate::bundle::Bundle> {
    let mut b = ctx.bundle()?;
    b.set("/linux/cgroupsPath", json!(ctx.cgroup_path(id)));
    let limit = 16 << 20;
    let memory = match super::cgroups::swap_supported() {
        true => json!({"limit": limit, "swap": limit}),
        false => json!({"limit": limit}),
    };
    b.set("/linux/resources/memory", memory);
    Ok(b)
}

/// Waits up to 10 s for `events` to print `{"type":"oom","id":ID}`, then
/// ends the stream; returns whether it did and what it printed.
fn wait_for_oom(events: crate::runtime::Pending, id: &str) -> (bool, String) {
    let want = json!({"type": "oom", "id": id});
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = loop {
        let now = events.stdout_now();
        let hit = now
            .lines()
            .any(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| v == want));
        if hit || Instant::now() >= deadline {
            break (hit, now);
        }
        crate::reaper::tick(Duration::from_millis(50));
    };
    let mut events = events;
    // runc's stream runs until delete; it is not needed further.
    let _ = events.child.kill();
    let _ = events.wait(Duration::from_secs(5));
    seen
}

/// Every field name of runc 1.1's `types.Stats` (types/events.go), and of
/// agentvm's addition `egress`; the keys of `memory.raw` and `hugetlb` are
/// the kernel's.
const NAMES: &[&str] = &[
    "cpu",
    "usage",
    "total",
    "percpu",
    "percpu_kernel",
    "percpu_user",
    "kernel",
    "user",
    "throttling",
    "periods",
    "throttledPeriods",
    "throttledTime",
    "cpuset",
    "cpus",
    "cpu_exclusive",
    "mems",
    "mem_hardwall",
    "mem_exclusive",
    "memory_migrate",
    "memory_spread_page",
    "memory_spread_slab",
    "memory_pressure",
    "sched_load_balance",
    "sched_relax_domain_level",
    "memory",
    "cache",
    "swap",
    "kernelTCP",
    "raw",
    "limit",
    "max",
    "failcnt",
    "pids",
    "current",
    "blkio",
    "ioServiceBytesRecursive",
    "ioServicedRecursive",
    "ioQueueRecursive",
    "ioServiceTimeRecursive",
    "ioWaitTimeRecursive",
    "ioMergedRecursive",
    "ioTimeRecursive",
    "sectorsRecursive",
    "major",
    "minor",
    "op",
    "value",
    "hugetlb",
    "intel_rdt",
    "network_interfaces",
    "egress",
    "allowed",
    "denied",
    "bytes_out",
    "bytes_in",
];

/// Fields runc 1.1 always writes (Go's omitempty never drops a struct, nor
/// these numbers).
const ALWAYS: &[&str] = &[
    "/cpu/usage/kernel",
    "/cpu/usage/user",
    "/cpu/throttling",
    "/cpuset/cpu_exclusive",
    "/cpuset/sched_load_balance",
    "/cpuset/sched_relax_domain_level",
    "/memory/usage/limit",
    "/memory/usage/failcnt",
    "/memory/swap/limit",
    "/memory/kernel/limit",
    "/memory/kernelTCP/limit",
    "/memory/kernelTCP/failcnt",
    "/pids",
    "/blkio",
    "/hugetlb",
    "/intel_rdt",
    "/network_interfaces",
];

/// Names in `v` that runc's stats do not have, as JSON pointers.
fn foreign(v: &Value, at: &str, out: &mut Vec<String>) {
    let Some(map) = v.as_object() else {
        if let Some(items) = v.as_array() {
            for (i, item) in items.iter().enumerate() {
                foreign(item, &format!("{at}/{i}"), out);
            }
        }
        return;
    };
    for (k, child) in map {
        let path = format!("{at}/{k}");
        if !NAMES.contains(&k.as_str()) {
            out.push(path.clone());
        }
        if k == "raw" || k == "hugetlb" {
            // The kernel's names; under hugetlb each size holds runc's.
            if k == "hugetlb" {
                for (size, h) in child.as_object().into_iter().flatten() {
                    foreign(h, &format!("{path}/{size}"), out);
                }
            }
            continue;
        }
        foreign(child, &path, out);
    }
}

fn stats(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let (id, _pid) = ctx.start_sleeper(&mut b)?;
    let out = ctx.rt.run(&["events", "--stats", &id])?;
    let lines: Vec<&str> = out.stdout.lines().collect();
    let event: Value = lines
        .first()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    ctx.check(
        "--stats: one line {type: stats, id, data}",
        out.success()
            && lines.len() == 1
            && event["type"] == "stats"
            && event["id"] == id.as_str()
            && event["data"].is_object(),
        || format!("{}; stdout {:?}", out.describe(), out.stdout),
    );
    let data = &event["data"];
    let missing: Vec<&&str> = ALWAYS
        .iter()
        .filter(|p| data.pointer(p).is_none())
        .collect();
    ctx.check(
        "--stats: the fields runc always writes",
        missing.is_empty(),
        || format!("missing {missing:?} in {data}"),
    );
    let mut odd = Vec::new();
    foreign(data, "", &mut odd);
    ctx.check(
        "--stats: no names runc's stats do not have",
        odd.is_empty(),
        || format!("{odd:?}"),
    );
    ctx.check(
        "--stats: memory in use and the one process counted",
        data.pointer("/memory/usage/usage")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            > 0
            && data.pointer("/pids/current") == Some(&json!(1)),
        || format!("memory {}, pids {}", data["memory"]["usage"], data["pids"]),
    );
    let out = ctx.rt.run(&["kill", &id, "KILL"])?;
    anyhow::ensure!(out.success(), "kill: {}", out.describe());
    let st = ctx.wait_status(&id, "stopped");
    anyhow::ensure!(st.is_ok(), "never stopped: {}", super::show(&st));
    let out = ctx.rt.run(&["events", "--stats", &id])?;
    ctx.check(
        "--stats of a stopped container: refused, not running",
        out.code == Some(1) && out.stderr.contains("is not running"),
        || out.describe(),
    );
    Ok(())
}

fn oom(ctx: &mut Ctx) -> Result<()> {
    let id = ctx.id();
    let mut b = limited(ctx, &id)?;
    ctx.start_sleeper_as(&mut b, &id)?;
    let events = ctx.rt.spawn(&["events", "--interval", "1h", &id])?;
    // Time to take the count as it is before the kill.
    crate::reaper::tick(Duration::from_millis(500));
    let out = ctx.rt.run(&["exec", &id, "/bin/sh", "-c", HOG])?;
    ctx.check(
        "a process over the limit is killed (137)",
        out.code == Some(137),
        || out.describe(),
    );
    let (hit, printed) = wait_for_oom(events, &id);
    ctx.check("events: the OOM kill as {type: oom, id}", hit, || {
        format!("events wrote {printed:?}")
    });
    Ok(())
}

/// The OOM killer ends the init itself: the kill is reported although the
/// container stops with it.
fn oom_init(ctx: &mut Ctx) -> Result<()> {
    let id = ctx.id();
    let mut b = limited(ctx, &id)?;
    // The init waits for /go, so that events watches before the kill.
    let script = format!("while [ ! -e /go ]; do sleep 0.1; done; {HOG}");
    b.args(&["/bin/sh", "-c", &script]);
    b.write()?;
    let out = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    anyhow::ensure!(out.success(), "create: {}", out.describe());
    let out = ctx.rt.run(&["start", &id])?;
    anyhow::ensure!(out.success(), "start: {}", out.describe());
    let events = ctx.rt.spawn(&["events", "--interval", "1h", &id])?;
    crate::reaper::tick(Duration::from_millis(500));
    std::fs::write(b.rootfs().join("go"), "")?;
    let st = ctx.wait_status(&id, "stopped");
    ctx.check("the init over the limit is killed", st.is_ok(), || {
        super::show(&st)
    });
    let (hit, printed) = wait_for_oom(events, &id);
    ctx.check(
        "events: the init's OOM kill as {type: oom, id}",
        hit,
        || format!("events wrote {printed:?}"),
    );
    Ok(())
}
