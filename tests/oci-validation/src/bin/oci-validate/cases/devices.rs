//! Default devices, linux.devices and the device cgroup.

use std::path::Path;

use anyhow::Result;
use oci_validation::expect::{Check, Expectations};
use serde_json::json;

use super::{CaseFn, Ctx};
use crate::report::Outcome;

pub const CASES: &[(&str, CaseFn)] = &[("devices-default", default), ("devices-custom", custom)];

fn node(path: &str, t: char, major: u64, minor: u64, mode: Option<u32>) -> Check {
    Check::Node {
        path: path.into(),
        node_type: t,
        major: Some(major),
        minor: Some(minor),
        mode,
        uid: None,
        gid: None,
    }
}

fn open(path: &str, write: bool, errno: Option<i32>) -> Check {
    Check::Open {
        path: path.into(),
        write,
        errno,
    }
}

fn default(ctx: &mut Ctx) -> Result<()> {
    let b = ctx.bundle()?;
    let mut e = Expectations::default();
    for (path, major, minor) in [
        ("/dev/null", 1, 3),
        ("/dev/zero", 1, 5),
        ("/dev/full", 1, 7),
        ("/dev/random", 1, 8),
        ("/dev/urandom", 1, 9),
        ("/dev/tty", 5, 0),
    ] {
        e.push(
            format!("{path} c {major}:{minor} 0666"),
            node(path, 'c', major, minor, Some(0o666)),
        );
    }
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        e.push(
            format!("{link} -> {target}"),
            Check::Symlink {
                path: link.into(),
                target: target.into(),
            },
        );
    }
    e.push(
        "/dev/pts/ptmx c 5:2",
        node("/dev/pts/ptmx", 'c', 5, 2, None),
    );
    e.push(
        "/dev/ptmx opens a pty master",
        open("/dev/ptmx", true, None),
    );
    e.push(
        "device cgroup allows writing /dev/null",
        open("/dev/null", true, None),
    );
    e.push(
        "device cgroup allows reading /dev/zero",
        open("/dev/zero", false, None),
    );
    e.push(
        "device cgroup allows reading /dev/urandom",
        open("/dev/urandom", false, None),
    );
    e.push(
        "device cgroup allows writing /dev/full",
        open("/dev/full", true, None),
    );
    e.push(
        "host devices not exposed (/dev/kmsg)",
        open("/dev/kmsg", false, Some(libc::ENOENT)),
    );
    ctx.run_checker(&b, &e)?;
    Ok(())
}

fn custom(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let devices = json!([
        {"path": "/dev/oci-char", "type": "c", "major": 1, "minor": 3,
         "fileMode": 0o640, "uid": 1000, "gid": 1000},
        {"path": "/dev/oci-block", "type": "b", "major": 7, "minor": 0, "fileMode": 0o660},
        {"path": "/dev/oci-fifo", "type": "p", "fileMode": 0o600},
        {"path": "/dev/net/tun", "type": "c", "major": 10, "minor": 200, "fileMode": 0o666},
        {"path": "/dev/oci-fuse", "type": "c", "major": 10, "minor": 229, "fileMode": 0o666},
        {"path": "/dev/oci-kmsg", "type": "c", "major": 1, "minor": 11, "fileMode": 0o600}
    ]);
    b.set("/linux/devices", devices);
    b.push(
        "/linux/resources/devices",
        json!({"allow": true, "type": "c", "major": 10, "minor": 200, "access": "rwm"}),
    );
    b.push(
        "/linux/resources/devices",
        json!({"allow": true, "type": "c", "major": 10, "minor": 229, "access": "r"}),
    );
    let mut e = Expectations::default();
    e.push(
        "char device numbers",
        node("/dev/oci-char", 'c', 1, 3, None),
    );
    e.push(
        "char device fileMode 0640",
        Check::Node {
            path: "/dev/oci-char".into(),
            node_type: 'c',
            major: None,
            minor: None,
            mode: Some(0o640),
            uid: None,
            gid: None,
        },
    );
    e.push(
        "char device owner 1000:1000",
        Check::Node {
            path: "/dev/oci-char".into(),
            node_type: 'c',
            major: None,
            minor: None,
            mode: None,
            uid: Some(1000),
            gid: Some(1000),
        },
    );
    e.push(
        "block device",
        node("/dev/oci-block", 'b', 7, 0, Some(0o660)),
    );
    e.push(
        "fifo",
        Check::Node {
            path: "/dev/oci-fifo".into(),
            node_type: 'p',
            major: None,
            minor: None,
            mode: Some(0o600),
            uid: None,
            gid: None,
        },
    );
    e.push(
        "device in a new subdirectory",
        node("/dev/net/tun", 'c', 10, 200, Some(0o666)),
    );
    // Opening these needs their drivers, which the host must have.
    let tun = Path::new("/dev/net/tun").exists();
    let fuse = Path::new("/dev/fuse").exists();
    let rwm = "cgroup rule rwm allows open for write";
    let r = "cgroup rule r allows open for read";
    if tun {
        e.push(rwm, open("/dev/net/tun", true, None));
    }
    if fuse {
        e.push(r, open("/dev/oci-fuse", false, None));
    }
    e.push(
        "cgroup rule r refuses open for write",
        open("/dev/oci-fuse", true, Some(libc::EPERM)),
    );
    e.push(
        "device without a cgroup rule refused",
        open("/dev/oci-kmsg", false, Some(libc::EPERM)),
    );
    ctx.run_checker(&b, &e)?;
    if !tun {
        ctx.record(rwm, Outcome::Skip("the host has no tun driver".into()));
    }
    if !fuse {
        ctx.record(r, Outcome::Skip("the host has no fuse driver".into()));
    }
    Ok(())
}
