//! Checks of the filesystem view: mounts, masked and read-only paths, device
//! nodes, file contents.

use std::ffi::CString;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

use oci_validation::expect::{Check, Propagation};

use crate::{expect_eq, mismatch, Failure, Verdict};

pub fn run(check: &Check) -> Verdict {
    match check {
        Check::FileContent { path, content } => {
            let got = read(path)?;
            expect_eq(path, squash(&got), squash(content))
        }
        Check::SameContent { path, other } => {
            let a = read(path)?;
            let b = read(other)?;
            if a == b {
                Ok(())
            } else {
                mismatch!("{path} is {:?} but {other} is {:?}", squash(&a), squash(&b))
            }
        }
        Check::Mount {
            target,
            fstype,
            options,
            absent_options,
            propagation,
        } => mount(
            target,
            fstype.as_deref(),
            options,
            absent_options,
            *propagation,
        ),
        Check::NotMounted { target } => match find_mount(target)? {
            None => Ok(()),
            Some(m) => mismatch!("{target} is a {} mount", m.fstype),
        },
        Check::Masked { path } => masked(path),
        Check::ReadOnly { path } => match statvfs_flags(path)? & libc::ST_RDONLY {
            0 => mismatch!("{path} is on a writable filesystem"),
            _ => Ok(()),
        },
        Check::Writable { path } => {
            let probe = format!("{}/.oci-checker-probe", path.trim_end_matches('/'));
            std::fs::write(&probe, b"x")
                .map_err(|e| Failure::Mismatch(format!("create {probe}: {e}")))?;
            std::fs::remove_file(&probe)
                .map_err(|e| Failure::Mismatch(format!("remove {probe}: {e}")))
        }
        Check::Node {
            path,
            node_type,
            major,
            minor,
            mode,
            uid,
            gid,
        } => node(path, *node_type, *major, *minor, *mode, (*uid, *gid)),
        Check::Symlink { path, target } => {
            let got = std::fs::read_link(path)
                .map_err(|e| Failure::Mismatch(format!("readlink {path}: {e}")))?;
            expect_eq(path, got.to_string_lossy().as_ref(), target.as_str())
        }
        Check::Open { path, write, errno } => {
            let r = if *write {
                std::fs::OpenOptions::new().write(true).open(path)
            } else {
                std::fs::File::open(path)
            };
            expect_eq(
                &format!("open {path} errno"),
                r.err().and_then(|e| e.raw_os_error()),
                *errno,
            )
        }
        Check::CgroupMountsReadOnly => {
            let all = mounts()?;
            let cg: Vec<&MountInfo> = all
                .iter()
                .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
                .collect();
            let rw: Vec<&str> = cg
                .iter()
                .filter(|m| !m.options.iter().any(|o| o == "ro"))
                .map(|m| m.target.as_str())
                .collect();
            match (cg.is_empty(), rw.is_empty()) {
                (true, _) => mismatch!("no cgroup filesystem is mounted"),
                (false, true) => Ok(()),
                (false, false) => mismatch!("writable cgroup mounts: {rw:?}"),
            }
        }
        _ => mismatch!("check routed to the wrong module"),
    }
}

fn read(path: &str) -> Result<String, Failure> {
    std::fs::read_to_string(path).map_err(|e| Failure::Mismatch(format!("read {path}: {e}")))
}

/// Collapses whitespace runs to one space and trims the ends.
fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// One line of /proc/self/mountinfo.
#[derive(Debug)]
pub struct MountInfo {
    pub root: String,
    pub target: String,
    pub options: Vec<String>,
    pub optional: Vec<String>,
    pub fstype: String,
    pub super_options: Vec<String>,
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (b[i], oct) {
            (b'\\', Some(v)) => {
                out.push(v);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_line(line: &str) -> Option<MountInfo> {
    let (pre, post) = line.split_once(" - ")?;
    let pre: Vec<&str> = pre.split(' ').collect();
    let post: Vec<&str> = post.split(' ').collect();
    let split = |s: &str| s.split(',').map(str::to_string).collect::<Vec<_>>();
    Some(MountInfo {
        root: unescape(pre.get(3)?),
        target: unescape(pre.get(4)?),
        options: split(pre.get(5)?),
        optional: pre.get(6..)?.iter().map(|s| (*s).to_string()).collect(),
        fstype: (*post.first()?).to_string(),
        super_options: split(post.get(2).copied().unwrap_or("")),
    })
}

/// Every mount this process sees, in mount order.
pub fn mounts() -> Result<Vec<MountInfo>, Failure> {
    let text = read("/proc/self/mountinfo")?;
    Ok(text.lines().filter_map(parse_line).collect())
}

/// The topmost (last) mount whose mount point is `target`.
fn find_mount(target: &str) -> Result<Option<MountInfo>, Failure> {
    Ok(mounts()?.into_iter().rev().find(|m| m.target == target))
}

fn mount(
    target: &str,
    fstype: Option<&str>,
    options: &[String],
    absent: &[String],
    propagation: Option<Propagation>,
) -> Verdict {
    let Some(m) = find_mount(target)? else {
        return mismatch!("nothing mounted at {target}");
    };
    if let Some(t) = fstype {
        expect_eq("fstype", m.fstype.as_str(), t)?;
    }
    let has = |o: &String| m.options.contains(o) || m.super_options.contains(o);
    let missing: Vec<&String> = options.iter().filter(|o| !has(o)).collect();
    let present: Vec<&String> = absent.iter().filter(|o| has(o)).collect();
    if !missing.is_empty() || !present.is_empty() {
        return mismatch!(
            "options {:?} / {:?}: missing {missing:?}, unwanted {present:?}",
            m.options,
            m.super_options
        );
    }
    if let Some(want) = propagation {
        let shared = m.optional.iter().any(|o| o.starts_with("shared:"));
        let slave = m.optional.iter().any(|o| o.starts_with("master:"));
        let got = match (shared, slave) {
            (true, _) => Propagation::Shared,
            (false, true) => Propagation::Slave,
            (false, false) => Propagation::Private,
        };
        if got != want {
            return mismatch!(
                "propagation {got:?} (fields {:?}), want {want:?}",
                m.optional
            );
        }
    }
    Ok(())
}

fn masked(path: &str) -> Verdict {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        // The harness skips the kernel's paths that the host lacks; a
        // container with a kernel of its own (a microVM) may lack others,
        // and masking cannot remove a path, so there is nothing to check.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && (path.starts_with("/proc/") || path.starts_with("/sys/")) =>
        {
            return Err(Failure::Skip(format!(
                "{path} does not exist in this container's kernel"
            )));
        }
        Err(e) => return mismatch!("stat {path}: {e}"),
    };
    if meta.is_dir() {
        let entries = std::fs::read_dir(path)
            .map_err(|e| Failure::Mismatch(format!("readdir {path}: {e}")))?
            .count();
        return match entries {
            0 => Ok(()),
            n => mismatch!("directory {path} shows {n} entries"),
        };
    }
    match std::fs::read(path) {
        Ok(b) if b.is_empty() => Ok(()),
        Ok(b) => mismatch!("{path} reads {} bytes", b.len()),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(()),
        Err(e) => mismatch!("read {path}: {e}"),
    }
}

fn statvfs_flags(path: &str) -> Result<u64, Failure> {
    let c = CString::new(path).map_err(|e| Failure::Mismatch(e.to_string()))?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is writable for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return mismatch!("statvfs {path}: {}", std::io::Error::last_os_error());
    }
    Ok(st.f_flag)
}

fn node(
    path: &str,
    node_type: char,
    major: Option<u64>,
    minor: Option<u64>,
    mode: Option<u32>,
    owner: (Option<u32>, Option<u32>),
) -> Verdict {
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| Failure::Mismatch(format!("stat {path}: {e}")))?;
    let ft = meta.file_type();
    let got = if ft.is_char_device() {
        'c'
    } else if ft.is_block_device() {
        'b'
    } else if ft.is_fifo() {
        'p'
    } else if ft.is_dir() {
        'd'
    } else if ft.is_symlink() {
        'l'
    } else {
        'f'
    };
    expect_eq("type", got, node_type)?;
    let rdev = meta.rdev();
    if let Some(want) = major {
        expect_eq("major", libc::major(rdev) as u64, want)?;
    }
    if let Some(want) = minor {
        expect_eq("minor", libc::minor(rdev) as u64, want)?;
    }
    if let Some(want) = mode {
        let got = meta.permissions().mode() & 0o7777;
        expect_eq("mode", format!("{got:04o}"), format!("{want:04o}"))?;
    }
    if let Some(want) = owner.0 {
        expect_eq("uid", meta.uid(), want)?;
    }
    if let Some(want) = owner.1 {
        expect_eq("gid", meta.gid(), want)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_with_optional_fields_and_escapes() {
        let m = parse_line(
            "36 35 98:0 /mnt1 /mnt\\040x rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue",
        )
        .unwrap();
        assert_eq!(m.root, "/mnt1");
        assert_eq!(m.target, "/mnt x");
        assert_eq!(m.options, vec!["rw", "noatime"]);
        assert_eq!(m.optional, vec!["master:1", "shared:2"]);
        assert_eq!(m.fstype, "ext3");
        assert_eq!(m.super_options, vec!["rw", "errors=continue"]);
    }

    #[test]
    fn squash_collapses_whitespace() {
        assert_eq!(squash("  0   100000 \t65536\n"), "0 100000 65536");
    }
}
