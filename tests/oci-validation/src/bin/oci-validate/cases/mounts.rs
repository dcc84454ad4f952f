//! mounts, root.readonly, propagation, maskedPaths and readonlyPaths.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use oci_validation::expect::{Check, Expectations, Probe, Propagation};
use serde_json::json;

use super::{CaseFn, Ctx};
use crate::bundle::{MASKED_PATHS, READONLY_PATHS};
use crate::report::Outcome;

pub const CASES: &[(&str, CaseFn)] = &[
    ("mounts-default", default),
    ("mounts-custom", custom),
    ("mounts-readonly-root", readonly_root),
    ("mounts-propagation", propagation),
    ("paths-masked-readonly", masked_custom),
    ("mounts-bind-errors", bind_errors),
];

/// The bind mounts users get wrong, refused at `create` in runc's words
/// (Docker adds its "Are you trying to mount a directory onto a file"
/// hint to "not a directory"): a missing source, a file onto a
/// directory, a directory onto a file. Nothing is left behind.
fn bind_errors(ctx: &mut Ctx) -> Result<()> {
    let host = ctx.scratch("bind-errors")?;
    let file = host.join("file");
    std::fs::write(&file, "x").context("write the source file")?;
    let (dir, file) = (host.display().to_string(), file.display().to_string());
    let missing = format!("{dir}/missing");
    let cases = [
        (
            "a missing source: stat's no such file or directory",
            missing.as_str(),
            "/mnt",
            format!(
                "error mounting \"{missing}\" to rootfs at \"/mnt\": stat {missing}: no such file or directory"
            ),
        ),
        (
            "a file onto a directory: not a directory",
            file.as_str(),
            "/etc",
            format!("error mounting \"{file}\" to rootfs at \"/etc\""),
        ),
        (
            "a directory onto a file: not a directory",
            dir.as_str(),
            "/etc/passwd",
            format!("error mounting \"{dir}\" to rootfs at \"/etc/passwd\""),
        ),
    ];
    for (check, source, dest, phrase) in &cases {
        let mut b = ctx.bundle()?;
        b.args(&["/bin/true"]);
        b.push(
            "/mounts",
            json!({"destination": dest, "type": "bind", "source": source, "options": ["rbind"]}),
        );
        ctx.check_run_refused(&b, check, phrase)?;
        if !phrase.contains("no such file") {
            // runc's mount(2) error; the phrase above is its prefix.
            let out = ctx.rt.run(&["run", "--bundle", &b.dir_str(), &ctx.id()])?;
            ctx.check(
                format!("{check}: says not a directory"),
                out.stderr.contains("not a directory"),
                || out.describe(),
            );
        }
    }
    Ok(())
}

fn mount_check(target: &str, fstype: Option<&str>, options: &[&str], absent: &[&str]) -> Check {
    Check::Mount {
        target: target.into(),
        fstype: fstype.map(str::to_string),
        options: options.iter().map(|s| (*s).to_string()).collect(),
        absent_options: absent.iter().map(|s| (*s).to_string()).collect(),
        propagation: None,
    }
}

fn write_probe(path: &str, errno: Option<i32>) -> Check {
    Check::Syscall {
        probe: Probe::WriteFile { path: path.into() },
        errno,
    }
}

fn default(ctx: &mut Ctx) -> Result<()> {
    let b = ctx.bundle()?;
    let mut e = Expectations::default();
    let mounts: &[(&str, &str, &[&str])] = &[
        ("/proc", "proc", &[]),
        ("/dev", "tmpfs", &["nosuid", "mode=755", "size=65536k"]),
        (
            "/dev/pts",
            "devpts",
            &["nosuid", "noexec", "gid=5", "mode=620", "ptmxmode=666"],
        ),
        (
            "/dev/shm",
            "tmpfs",
            &["nosuid", "nodev", "noexec", "size=65536k"],
        ),
        ("/dev/mqueue", "mqueue", &["nosuid", "nodev", "noexec"]),
        ("/sys", "sysfs", &["ro", "nosuid", "nodev", "noexec"]),
    ];
    for (target, fstype, opts) in mounts {
        let name = match opts.is_empty() {
            true => format!("{target} is {fstype}"),
            false => format!("{target} is {fstype} {}", opts.join(",")),
        };
        e.push(name, mount_check(target, Some(fstype), opts, &[]));
    }
    e.push("cgroup filesystems read-only", Check::CgroupMountsReadOnly);
    e.push("root writable", mount_check("/", None, &[], &["ro"]));
    let mut skipped = Vec::new();
    for p in MASKED_PATHS {
        if Path::new(p).exists() {
            e.push(format!("masked {p}"), Check::Masked { path: (*p).into() });
        } else {
            skipped.push(*p);
        }
    }
    let mut skipped_ro = Vec::new();
    for p in READONLY_PATHS {
        if Path::new(p).exists() {
            e.push(
                format!("read-only {p}"),
                Check::ReadOnly { path: (*p).into() },
            );
        } else {
            skipped_ro.push(*p);
        }
    }
    e.push(
        "write to /proc/sys refused",
        write_probe("/proc/sys/kernel/hostname", Some(libc::EROFS)),
    );
    ctx.run_checker(&b, &e)?;
    for p in skipped {
        ctx.record(
            format!("masked {p}"),
            Outcome::Skip(format!("{p} does not exist on this host's kernel")),
        );
    }
    for p in skipped_ro {
        ctx.record(
            format!("read-only {p}"),
            Outcome::Skip(format!("{p} does not exist on this host's kernel")),
        );
    }
    Ok(())
}

/// Host-side sources for bind mounts.
struct Sources {
    src: PathBuf,
    rw: PathBuf,
    single: PathBuf,
}

fn sources(ctx: &mut Ctx) -> Result<Sources> {
    let src = ctx.scratch("src")?;
    std::fs::write(src.join("hello.txt"), "hello from the host").context("write hello.txt")?;
    let rw = ctx.scratch("rw")?;
    let files = ctx.scratch("files")?;
    let single = files.join("single.txt");
    std::fs::write(&single, "a single file").context("write single.txt")?;
    Ok(Sources { src, rw, single })
}

fn custom(ctx: &mut Ctx) -> Result<()> {
    let s = sources(ctx)?;
    let (src, rw, single) = (
        s.src.to_string_lossy().into_owned(),
        s.rw.to_string_lossy().into_owned(),
        s.single.to_string_lossy().into_owned(),
    );
    let mut b = ctx.bundle()?;
    let mounts = json!([
        {"destination": "/mnt/tmpfs", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "noexec", "size=1m", "mode=1770"]},
        {"destination": "/mnt/tmpfs/inner", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "/mnt/ro", "type": "bind", "source": src, "options": ["rbind", "ro"]},
        {"destination": "/mnt/rw", "type": "bind", "source": rw, "options": ["rbind", "rw"]},
        {"destination": "/etc/single.txt", "type": "bind", "source": single, "options": ["bind", "ro"]},
        {"destination": "/mnt/deep/new/dir", "type": "bind", "source": src, "options": ["bind"]},
        {"destination": "/mnt/flags", "type": "bind", "source": src,
         "options": ["rbind", "nosuid", "nodev", "noexec"]},
        {"destination": "/mnt/ro-tmpfs", "type": "tmpfs", "source": "tmpfs", "options": ["ro"]},
        {"destination": "/mnt/notype", "source": src, "options": ["rbind", "ro"]}
    ]);
    for m in mounts.as_array().into_iter().flatten() {
        b.push("/mounts", m.clone());
    }
    let hello = |p: &str| Check::FileContent {
        path: p.into(),
        content: "hello from the host".into(),
    };
    let mut e = Expectations::default();
    e.push(
        "tmpfs with options",
        mount_check(
            "/mnt/tmpfs",
            Some("tmpfs"),
            &["nosuid", "nodev", "noexec", "size=1024k", "mode=1770"],
            &["ro"],
        ),
    );
    e.push(
        "tmpfs writable",
        Check::Writable {
            path: "/mnt/tmpfs".into(),
        },
    );
    e.push(
        "mounts applied in order (nested tmpfs)",
        mount_check("/mnt/tmpfs/inner", Some("tmpfs"), &[], &[]),
    );
    e.push("ro bind shows the source", hello("/mnt/ro/hello.txt"));
    e.push(
        "ro bind is read-only",
        Check::ReadOnly {
            path: "/mnt/ro".into(),
        },
    );
    e.push(
        "ro bind refuses writes",
        write_probe("/mnt/ro/new", Some(libc::EROFS)),
    );
    e.push(
        "rw bind accepts writes",
        write_probe("/mnt/rw/from-container", None),
    );
    e.push(
        "file bind mount",
        Check::FileContent {
            path: "/etc/single.txt".into(),
            content: "a single file".into(),
        },
    );
    e.push(
        "missing destination is created",
        hello("/mnt/deep/new/dir/hello.txt"),
    );
    e.push(
        "bind mount flags nosuid,nodev,noexec",
        mount_check("/mnt/flags", None, &["nosuid", "nodev", "noexec"], &[]),
    );
    e.push(
        "ro tmpfs",
        Check::ReadOnly {
            path: "/mnt/ro-tmpfs".into(),
        },
    );
    e.push("bind mount without a type", hello("/mnt/notype/hello.txt"));
    ctx.run_checker(&b, &e)?;
    let written = std::fs::read_to_string(s.rw.join("from-container"));
    ctx.check(
        "write through rw bind visible on the host",
        written.as_deref().is_ok_and(|c| c == "x"),
        || format!("host file: {written:?}"),
    );
    Ok(())
}

fn readonly_root(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.set("/root/readonly", json!(true));
    let mut e = Expectations::default();
    e.push(
        "root mounted read-only",
        Check::ReadOnly { path: "/".into() },
    );
    e.push(
        "write to root refused",
        write_probe("/newfile", Some(libc::EROFS)),
    );
    e.push(
        "/dev/shm still writable",
        Check::Writable {
            path: "/dev/shm".into(),
        },
    );
    e.push(
        "/dev still writable",
        Check::Writable {
            path: "/dev".into(),
        },
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

/// A tmpfs mounted on the host with shared propagation; unmounted on drop.
struct SharedMount(PathBuf);

impl SharedMount {
    fn new(dir: PathBuf) -> Result<SharedMount> {
        mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .with_context(|| format!("mount tmpfs on {}", dir.display()))?;
        let m = SharedMount(dir);
        mount(
            None::<&str>,
            &m.0,
            None::<&str>,
            MsFlags::MS_SHARED,
            None::<&str>,
        )
        .with_context(|| format!("make {} shared", m.0.display()))?;
        Ok(m)
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        // Lazy unmount also takes submounts made by the case.
        if let Err(e) = umount2(&self.0, MntFlags::MNT_DETACH) {
            eprintln!("warning: umount {}: {e}", self.0.display());
        }
    }
}

fn propagation(ctx: &mut Ctx) -> Result<()> {
    let dir = ctx.scratch("shared")?;
    let shared = SharedMount::new(dir.clone())?;
    let src = dir.to_string_lossy().into_owned();
    let mut b = ctx.bundle()?;
    let kinds = [
        ("slave", "rslave"),
        ("private", "rprivate"),
        ("shared", "rshared"),
    ];
    for (name, opt) in kinds {
        b.push(
            "/mounts",
            json!({"destination": format!("/mnt/{name}"), "type": "bind",
                   "source": src, "options": ["rbind", opt]}),
        );
    }
    let prop = |t: &str, p: Propagation| Check::Mount {
        target: t.into(),
        fstype: None,
        options: vec![],
        absent_options: vec![],
        propagation: Some(p),
    };
    let mut e = Expectations::default();
    e.push(
        "rslave bind is a slave",
        prop("/mnt/slave", Propagation::Slave),
    );
    e.push(
        "rprivate bind is private",
        prop("/mnt/private", Propagation::Private),
    );
    e.push(
        "rshared bind is shared",
        prop("/mnt/shared", Propagation::Shared),
    );
    let (id, _pid) = ctx.start_sleeper(&mut b)?;
    ctx.exec_checker(&b, &id, &e, &[])?;
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).context("create shared/sub")?;
    mount(
        Some("tmpfs"),
        &sub,
        Some("tmpfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .context("mount tmpfs on shared/sub")?;
    let mut live = Expectations::default();
    live.push(
        "host mount propagates into rslave bind",
        mount_check("/mnt/slave/sub", Some("tmpfs"), &[], &[]),
    );
    live.push(
        "host mount propagates into rshared bind",
        mount_check("/mnt/shared/sub", Some("tmpfs"), &[], &[]),
    );
    live.push(
        "host mount does not reach rprivate bind",
        Check::NotMounted {
            target: "/mnt/private/sub".into(),
        },
    );
    ctx.exec_checker(&b, &id, &live, &[])?;
    ctx.rt.quiet(&["delete", "--force", &id]);
    drop(shared);
    Ok(())
}

fn masked_custom(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let root = b.rootfs();
    std::fs::create_dir_all(root.join("masked-dir")).context("create masked-dir")?;
    std::fs::write(root.join("masked-dir/secret"), "secret").context("write secret")?;
    std::fs::write(root.join("masked-file"), "secret").context("write masked-file")?;
    std::fs::create_dir_all(root.join("ro-dir")).context("create ro-dir")?;
    std::fs::write(root.join("ro-dir/file"), "data").context("write ro-dir/file")?;
    for p in ["/masked-dir", "/masked-file", "/does/not/exist"] {
        b.push("/linux/maskedPaths", json!(p));
    }
    b.push("/linux/readonlyPaths", json!("/ro-dir"));
    let mut e = Expectations::default();
    e.push(
        "masked directory lists empty",
        Check::Masked {
            path: "/masked-dir".into(),
        },
    );
    e.push(
        "masked file reads empty",
        Check::Masked {
            path: "/masked-file".into(),
        },
    );
    e.push(
        "masked file cannot be written",
        write_probe("/masked-dir/new", Some(libc::EROFS)),
    );
    e.push(
        "read-only path",
        Check::ReadOnly {
            path: "/ro-dir".into(),
        },
    );
    e.push(
        "read-only path keeps its content",
        Check::FileContent {
            path: "/ro-dir/file".into(),
            content: "data".into(),
        },
    );
    e.push(
        "read-only path refuses writes",
        write_probe("/ro-dir/new", Some(libc::EROFS)),
    );
    e.push(
        "root outside read-only path writable",
        Check::Writable { path: "/".into() },
    );
    e.push(
        "masked path that does not exist is ignored",
        Check::Pid { pid: 1 },
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}
