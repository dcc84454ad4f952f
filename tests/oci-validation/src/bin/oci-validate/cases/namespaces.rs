//! linux.namespaces: new ones, none, joined by path; user namespace mappings.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sched::CloneFlags;
use oci_validation::caps;
use oci_validation::expect::{Check, Expectations, Relation};
use serde_json::json;

use super::{host_ns, ns_check, CaseFn, Ctx};
use crate::bundle::DEFAULT_CAPS;

pub const CASES: &[(&str, CaseFn)] = &[
    ("ns-new", new),
    ("ns-cgroup", cgroup),
    ("ns-host", host),
    ("ns-join-path", join_path),
    ("ns-user", user),
    ("ns-user-ranges", user_ranges),
    ("ns-user-unreachable-bind", user_unreachable_bind),
];

fn new(ctx: &mut Ctx) -> Result<()> {
    let b = ctx.bundle()?;
    let mut e = Expectations::default();
    for ns in ["pid", "net", "ipc", "uts", "mnt"] {
        e.push(
            format!("new {ns} namespace"),
            ns_check(ns, Relation::Differs, host_ns(ctx.env, ns)),
        );
    }
    for ns in ["cgroup", "user", "time"] {
        e.push(
            format!("{ns} namespace not asked for is the host's"),
            ns_check(ns, Relation::Same, host_ns(ctx.env, ns)),
        );
    }
    ctx.run_checker(&b, &e)?;
    Ok(())
}

fn cgroup(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.push("/linux/namespaces", json!({"type": "cgroup"}));
    let mut e = Expectations::default();
    e.push(
        "new cgroup namespace",
        ns_check("cgroup", Relation::Differs, host_ns(ctx.env, "cgroup")),
    );
    e.push("cgroup namespace rooted at own cgroup", Check::CgroupNsRoot);
    ctx.run_checker(&b, &e)?;
    Ok(())
}

fn host(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.keep_namespaces(&["mount"]);
    b.remove("", "hostname");
    let hostname =
        std::fs::read_to_string("/proc/sys/kernel/hostname").context("read the host's hostname")?;
    let mut e = Expectations::default();
    for ns in ["pid", "net", "ipc", "uts"] {
        e.push(
            format!("no {ns} namespace: the host's"),
            ns_check(ns, Relation::Same, host_ns(ctx.env, ns)),
        );
    }
    e.push(
        "hostname untouched without a uts namespace",
        Check::FileContent {
            path: "/proc/sys/kernel/hostname".into(),
            content: hostname,
        },
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

/// A shell in its own net, uts, ipc and cgroup namespaces whose child
/// `sleep` is pid 1 of a new pid namespace; the sleep's namespaces are joined.
struct Holder {
    shell: Child,
    inner: i32,
}

impl Holder {
    fn spawn() -> Result<Holder> {
        let mut cmd = Command::new("/bin/busybox");
        cmd.args(["sh", "-c", "sleep 600 & wait"])
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // SAFETY: unshare(2) is async-signal-safe and touches no memory of
        // the parent; it runs in the forked child before exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sched::unshare(
                    CloneFlags::CLONE_NEWNET
                        | CloneFlags::CLONE_NEWUTS
                        | CloneFlags::CLONE_NEWIPC
                        | CloneFlags::CLONE_NEWCGROUP
                        | CloneFlags::CLONE_NEWPID,
                )
                .map_err(std::io::Error::from)
            });
        }
        let shell = cmd.spawn().context("spawn namespace holder")?;
        crate::reaper::register(shell.id());
        let mut h = Holder { shell, inner: 0 };
        h.inner = find_child(h.shell.id()).context("find the holder's sleep")?;
        Ok(h)
    }

    fn path(&self, ns: &str) -> String {
        format!("/proc/{}/ns/{ns}", self.inner)
    }
}

/// Polls /proc for a child of `parent` (up to 10 s).
fn find_child(parent: u32) -> Result<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        for e in std::fs::read_dir("/proc")?.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(parent) {
                return Ok(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    bail!("no child of {parent} appeared")
}

impl Drop for Holder {
    fn drop(&mut self) {
        // Both processes are ours; either may already be gone.
        if self.inner > 0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.inner),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.shell.kill();
        let _ = self.shell.wait();
        crate::reaper::unregister(self.shell.id());
    }
}

fn join_path(ctx: &mut Ctx) -> Result<()> {
    let holder = Holder::spawn()?;
    let mut b = ctx.bundle()?;
    b.keep_namespaces(&["mount"]);
    b.remove("", "hostname");
    let mut e = Expectations::default();
    for (ns, kind) in [
        ("net", "network"),
        ("uts", "uts"),
        ("ipc", "ipc"),
        ("cgroup", "cgroup"),
        ("pid", "pid"),
    ] {
        let path = holder.path(ns);
        b.push("/linux/namespaces", json!({"type": kind, "path": path}));
        let link = std::fs::read_link(&path)
            .with_context(|| format!("readlink {path}"))?
            .to_string_lossy()
            .into_owned();
        e.push(
            format!("{kind} namespace joined by path"),
            ns_check(ns, Relation::Same, link),
        );
    }
    e.push(
        "joined namespaces are not the host's",
        ns_check("net", Relation::Differs, host_ns(ctx.env, "net")),
    );
    ctx.run_checker(&b, &e)?;
    drop(holder);
    Ok(())
}

fn user(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    super::user_namespace(&mut b);
    let mut e = Expectations::default();
    e.push(
        "new user namespace",
        ns_check("user", Relation::Differs, host_ns(ctx.env, "user")),
    );
    e.push(
        "uidMappings",
        Check::FileContent {
            path: "/proc/self/uid_map".into(),
            content: "0 100000 65536".into(),
        },
    );
    e.push(
        "gidMappings",
        Check::FileContent {
            path: "/proc/self/gid_map".into(),
            content: "0 200000 65536".into(),
        },
    );
    e.push("uid 0 inside", Check::Uid { uid: 0 });
    e.push("gid 0 inside", Check::Gid { gid: 0 });
    e.push(
        "unmapped host root shows as overflow uid",
        Check::Node {
            path: "/bin".into(),
            node_type: 'd',
            major: None,
            minor: None,
            mode: None,
            uid: Some(65534),
            gid: Some(65534),
        },
    );
    e.push(
        "capabilities apply inside the user namespace",
        Check::CapSet {
            field: "CapEff".into(),
            mask: caps::mask(DEFAULT_CAPS).map_err(anyhow::Error::msg)?,
        },
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

/// Mappings of several ranges must be written to the map files at once.
fn user_ranges(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.push("/linux/namespaces", json!({"type": "user"}));
    b.set(
        "/linux/uidMappings",
        json!([{"containerID": 0, "hostID": 100000, "size": 1000},
               {"containerID": 1000, "hostID": 300000, "size": 1}]),
    );
    b.set(
        "/linux/gidMappings",
        json!([{"containerID": 0, "hostID": 200000, "size": 1000},
               {"containerID": 1000, "hostID": 300000, "size": 1}]),
    );
    let mut e = Expectations::default();
    e.push(
        "uidMappings with two ranges",
        Check::FileContent {
            path: "/proc/self/uid_map".into(),
            content: "0 100000 1000 1000 300000 1".into(),
        },
    );
    e.push(
        "gidMappings with two ranges",
        Check::FileContent {
            path: "/proc/self/gid_map".into(),
            content: "0 200000 1000 1000 300000 1".into(),
        },
    );
    e.push(
        "file of host uid 300000 shows as uid 1000",
        Check::Node {
            path: "/home/user".into(),
            node_type: 'd',
            major: None,
            minor: None,
            mode: None,
            uid: Some(1000),
            gid: Some(1000),
        },
    );
    let home = b.rootfs().join("home/user");
    std::os::unix::fs::chown(&home, Some(300000), Some(300000)).context("chown home/user")?;
    ctx.run_checker(&b, &e)?;
    Ok(())
}

/// With a user namespace, bind sources below a host directory its root
/// cannot search (mode 0700, the host root's): runc 1.1 opens them outside
/// the namespace, so the container starts; inside, the sources' own modes
/// and the mount's `ro` hold.
fn user_unreachable_bind(ctx: &mut Ctx) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let scratch = ctx.scratch("unreachable")?;
    let private = scratch.join("private");
    let dir = private.join("dir");
    std::fs::create_dir_all(&dir).context("mkdir")?;
    let files = [
        (dir.join("open"), "reached\n", 0o644),
        (dir.join("closed"), "secret\n", 0o600),
        (private.join("one-file"), "a file\n", 0o644),
    ];
    for (path, text, mode) in &files {
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode))?;
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
    let mut b = ctx.bundle()?;
    super::user_namespace(&mut b);
    b.push(
        "/mounts",
        json!({"destination": "/tmp", "type": "bind",
               "source": dir.to_string_lossy(), "options": ["rbind", "ro"]}),
    );
    b.push(
        "/mounts",
        json!({"destination": "/dev/one-file", "type": "bind",
               "source": private.join("one-file").to_string_lossy(), "options": ["bind"]}),
    );
    b.args(&[
        "/bin/sh",
        "-c",
        "echo \"open=$(cat /tmp/open)\"; echo \"file=$(cat /dev/one-file)\"; \
         cat /tmp/closed >/dev/null 2>&1 && echo closed=read || echo closed=refused; \
         touch /tmp/new 2>/dev/null && echo write=made || echo write=refused",
    ]);
    b.write()?;
    let id = ctx.id();
    let out = ctx.rt.run(&["run", "--bundle", &b.dir_str(), &id])?;
    let lines: Vec<&str> = out.stdout.lines().collect();
    let has = |l: &str| lines.contains(&l);
    let got = || out.describe() + " | stdout: " + &out.stdout.replace('\n', " ");
    let ran = out.success();
    ctx.check("the container starts", ran, got);
    ctx.check(
        "the directory source is mounted",
        ran && has("open=reached"),
        got,
    );
    ctx.check("the file source is mounted", ran && has("file=a file"), got);
    ctx.check(
        "a file the mapped root may not read stays closed",
        ran && has("closed=refused"),
        got,
    );
    ctx.check("ro holds", ran && has("write=refused"), got);
    ctx.check(
        "nothing was written to the source",
        !dir.join("new").exists(),
        || "/tmp/new reached the source".into(),
    );
    Ok(())
}
