//! uid/gid maps with more than one range.
//!
//! libcontainer 0.7 writes a single-range map to `/proc/<pid>/uid_map`
//! itself but hands a multi-range one to the first `newuidmap`/`newgidmap`
//! on `PATH`, even when it runs as root, and ignores their exit status.
//! shadow's helpers check `/etc/subuid` even for root, so the map is never
//! written and the container fails later with EINVAL.
//!
//! When agentvm runs privileged and the spec has such a map, `create` puts
//! a private directory first on `PATH` for the duration of libcontainer's
//! `build()`; its `newuidmap` and `newgidmap` are symlinks to this very
//! binary (`/proc/<our pid>/exe`), which, started under those names, writes
//! the map in one `write()` as the kernel requires. Unprivileged, nothing
//! changes: the system's setuid helpers are what is needed then.
//!
//! The helper is dispatched before `main`, from an `.init_array`
//! constructor ([`ID_MAP_HELPER`]) that looks at the name the process was
//! started under: an agentvm started as `newuidmap`/`newgidmap` does that
//! job and exits; started under any other name it does nothing.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxNamespaceType, Spec};

#[derive(Debug, thiserror::Error)]
pub enum IdMapError {
    #[error("usage: {0} PID CONTAINER-ID HOST-ID SIZE [CONTAINER-ID HOST-ID SIZE]...")]
    Usage(&'static str),
    #[error("invalid {what} {value:?}")]
    Invalid { what: &'static str, value: String },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("short write to {path}: {written} of {len} bytes")]
    Short {
        path: PathBuf,
        written: usize,
        len: usize,
    },
    #[error("cannot prepare the id-map helpers in {path}: {source}")]
    Prepare { path: PathBuf, source: io::Error },
    #[error(
        "cannot bind mount {from} at {destination}: the user namespace's root (host uid {uid}) \
         cannot search {dir} (mode {mode:o}, owner {owner}:{group})"
    )]
    Unreachable {
        from: PathBuf,
        destination: PathBuf,
        uid: u32,
        dir: PathBuf,
        mode: u32,
        owner: u32,
        group: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Uid,
    Gid,
}

impl Kind {
    fn from_name(name: &OsStr) -> Option<Kind> {
        match name.to_str()? {
            "newuidmap" => Some(Kind::Uid),
            "newgidmap" => Some(Kind::Gid),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Uid => "newuidmap",
            Kind::Gid => "newgidmap",
        }
    }

    fn file(self) -> &'static str {
        match self {
            Kind::Uid => "uid_map",
            Kind::Gid => "gid_map",
        }
    }
}

/// Runs [`helper_main`] before `main` (and before the Rust runtime has
/// recorded the arguments, hence /proc/self/cmdline).
#[used]
#[link_section = ".init_array"]
static ID_MAP_HELPER: extern "C" fn() = id_map_helper_entry;

extern "C" fn id_map_helper_entry() {
    let Ok(cmdline) = std::fs::read("/proc/self/cmdline") else {
        return;
    };
    let args: Vec<OsString> = cmdline
        .split(|b| *b == 0)
        .map(|a| OsStr::from_bytes(a).to_os_string())
        .collect();
    if let Some(code) = helper_main(&args) {
        std::process::exit(i32::from(code));
    }
}

/// When `args[0]` names `newuidmap`/`newgidmap` (as libcontainer starts
/// the helpers of [`MapHelpers`]), writes the map and returns the exit
/// code; otherwise None.
fn helper_main(args: &[OsString]) -> Option<u8> {
    let (argv0, rest) = args.split_first()?;
    let kind = Kind::from_name(Path::new(argv0).file_name()?)?;
    // cmdline ends with a NUL: drop the empty last field.
    let rest = match rest.split_last() {
        Some((last, init)) if last.is_empty() => init,
        _ => rest,
    };
    match parse(kind, rest).and_then(|(pid, map)| write_map(kind, pid, &map)) {
        Ok(()) => Some(0),
        Err(e) => {
            // Never a panic here: this runs before main, outside any unwinding.
            let _ = writeln!(io::stderr(), "{}: {e}", kind.name());
            Some(1)
        }
    }
}

/// `PID (CONTAINER-ID HOST-ID SIZE)+` into the pid and the map's text.
fn parse(kind: Kind, args: &[OsString]) -> Result<(u32, String), IdMapError> {
    let text = |v: &OsString| v.to_string_lossy().into_owned();
    let (pid, triples) = args.split_first().ok_or(IdMapError::Usage(kind.name()))?;
    if triples.is_empty() || triples.len() % 3 != 0 {
        return Err(IdMapError::Usage(kind.name()));
    }
    let pid: u32 =
        text(pid)
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| IdMapError::Invalid {
                what: "pid",
                value: text(pid),
            })?;
    let mut map = String::new();
    for t in triples.chunks(3) {
        let mut n = [0u32; 3];
        for (slot, v) in n.iter_mut().zip(t) {
            *slot = text(v).parse().map_err(|_| IdMapError::Invalid {
                what: "id or size",
                value: text(v),
            })?;
        }
        map.push_str(&format!("{} {} {}\n", n[0], n[1], n[2]));
    }
    Ok((pid, map))
}

/// The kernel takes a map in exactly one write.
fn write_map(kind: Kind, pid: u32, map: &str) -> Result<(), IdMapError> {
    let path = PathBuf::from(format!("/proc/{pid}/{}", kind.file()));
    let write_err = |source| IdMapError::Write {
        path: path.clone(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&path)
        .map_err(write_err)?;
    let written = f.write(map.as_bytes()).map_err(write_err)?;
    if written != map.len() {
        return Err(IdMapError::Short {
            path,
            written,
            len: map.len(),
        });
    }
    Ok(())
}

/// Whether the spec makes a new user namespace (not one joined by path).
fn makes_user_namespace(linux: &oci_spec::runtime::Linux) -> bool {
    linux
        .namespaces()
        .iter()
        .flatten()
        .any(|n| n.typ() == LinuxNamespaceType::User && n.path().is_none())
}

/// Whether libcontainer would run newuidmap/newgidmap for this spec.
pub fn needs_helpers(spec: &Spec) -> bool {
    let Some(linux) = spec.linux() else {
        return false;
    };
    let ranges = |m: &Option<Vec<_>>| m.as_ref().map_or(0, Vec::len);
    makes_user_namespace(linux)
        && (ranges(linux.uid_mappings()) > 1 || ranges(linux.gid_mappings()) > 1)
}

/// One id map range: container id, host id, size.
type Range = (u32, u32, u32);

/// The host ids of the new user namespace's uid 0 and gid 0, and its uid
/// and gid maps, when the spec makes one.
fn new_userns_root(spec: &Spec) -> Option<(u32, u32, Vec<Range>, Vec<Range>)> {
    let linux = spec.linux().as_ref().filter(|l| makes_user_namespace(l))?;
    let ranges = |m: &Option<Vec<oci_spec::runtime::LinuxIdMapping>>| -> Vec<Range> {
        m.iter()
            .flatten()
            .map(|r| (r.container_id(), r.host_id(), r.size()))
            .collect()
    };
    let (uids, gids) = (ranges(linux.uid_mappings()), ranges(linux.gid_mappings()));
    let host_of = |m: &[Range]| {
        m.iter()
            .find(|(c, _, size)| *c == 0 && *size > 0)
            .map(|(_, h, _)| *h)
    };
    Some((host_of(&uids)?, host_of(&gids)?, uids, gids))
}

/// The bind mounts (index in the spec's mounts, and why) whose source the
/// new user namespace's root cannot reach. libcontainer resolves and
/// mounts a source from inside the namespace, where such a mount fails as
/// "failed to prepare rootfs" without naming it; runc 1.1 opens it outside
/// the namespace and the container starts (the workload is then refused
/// the files themselves, by their own modes). Root in the namespace
/// searches a directory if its permission bits let the mapped uid or gid
/// in, or if the directory's owner and group are both mapped (its
/// CAP_DAC_OVERRIDE then applies). See `binds` for what `create` does
/// with them.
pub fn unreachable_bind_sources(spec: &Spec) -> Vec<(usize, IdMapError)> {
    let Some((uid, gid, uids, gids)) = new_userns_root(spec) else {
        return Vec::new();
    };
    if !privileged() || nix::unistd::geteuid().as_raw() == uid {
        return Vec::new();
    }
    let mapped = |m: &[Range], id: u32| {
        m.iter()
            .any(|(_, h, size)| id >= *h && u64::from(id) < u64::from(*h) + u64::from(*size))
    };
    let mut found = Vec::new();
    for (i, m) in spec.mounts().iter().flatten().enumerate() {
        let Some(source) = m.source().as_ref().filter(|_| super::fixup::is_bind(m)) else {
            continue;
        };
        // A source that does not exist fails later with its own error.
        let Ok(real) = std::fs::canonicalize(source) else {
            continue;
        };
        for dir in real.ancestors().skip(1) {
            let Ok(meta) = std::fs::metadata(dir) else {
                continue;
            };
            use std::os::unix::fs::MetadataExt;
            let mode = meta.mode() & 0o7777;
            let bits = if meta.uid() == uid {
                mode >> 6
            } else if meta.gid() == gid {
                mode >> 3
            } else {
                mode
            };
            let overridden = mapped(&uids, meta.uid()) && mapped(&gids, meta.gid());
            // An access ACL may let the mapped root in where the mode
            // bits do not: such a directory is left to the kernel.
            if bits & 0o1 == 0 && !overridden && !has_access_acl(dir) {
                found.push((
                    i,
                    IdMapError::Unreachable {
                        from: source.clone(),
                        destination: m.destination().clone(),
                        uid,
                        dir: dir.to_path_buf(),
                        mode,
                        owner: meta.uid(),
                        group: meta.gid(),
                    },
                ));
                break;
            }
        }
    }
    found
}

/// Whether `dir` carries a POSIX access ACL (`system.posix_acl_access`).
fn has_access_acl(dir: &Path) -> bool {
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: both strings are NUL-terminated and outlive the call; a null
    // buffer of size 0 asks only for the value's size.
    let size = unsafe {
        libc::getxattr(
            path.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    size > 0
}

/// Root in the initial user namespace: what libcontainer calls privileged.
fn privileged() -> bool {
    nix::unistd::geteuid().is_root()
        && std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| m.contains("4294967295"))
}

/// Our helpers first on PATH while alive; PATH and the directory are
/// restored and removed on drop.
pub struct MapHelpers {
    dir: PathBuf,
    old_path: Option<OsString>,
}

impl MapHelpers {
    /// Installs the helpers when `spec` needs them and we are privileged.
    pub fn install(spec: &Spec, state_root: &Path) -> Result<Option<MapHelpers>, IdMapError> {
        if !needs_helpers(spec) || !privileged() {
            return Ok(None);
        }
        let dir = state_root.join(format!(".idmap-{}", std::process::id()));
        let prepare = |source| IdMapError::Prepare {
            path: dir.clone(),
            source,
        };
        // A directory left by a crashed agentvm with the same pid.
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(prepare)?;
        }
        std::fs::create_dir(&dir).map_err(prepare)?;
        let helpers = MapHelpers {
            dir: dir.clone(),
            old_path: std::env::var_os("PATH"),
        };
        let exe = PathBuf::from(format!("/proc/{}/exe", std::process::id()));
        for kind in [Kind::Uid, Kind::Gid] {
            std::os::unix::fs::symlink(&exe, dir.join(kind.name())).map_err(prepare)?;
        }
        let mut paths = vec![dir.clone()];
        if let Some(old) = &helpers.old_path {
            paths.extend(std::env::split_paths(old));
        }
        let joined = std::env::join_paths(paths)
            .map_err(|e| prepare(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        // agentvm is single-threaded while it creates a container.
        std::env::set_var("PATH", joined);
        tracing::debug!("id-map helpers in {}", dir.display());
        Ok(Some(helpers))
    }
}

impl Drop for MapHelpers {
    fn drop(&mut self) {
        match &self.old_path {
            Some(p) => std::env::set_var("PATH", p),
            None => std::env::remove_var("PATH"),
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!("cannot remove {}: {e}", self.dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use oci_spec::runtime::SpecBuilder;

    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn helper_names() {
        assert_eq!(Kind::from_name(OsStr::new("newuidmap")), Some(Kind::Uid));
        assert_eq!(Kind::from_name(OsStr::new("newgidmap")), Some(Kind::Gid));
        assert_eq!(Kind::from_name(OsStr::new("agentvm")), None);
    }

    #[test]
    fn only_the_helper_names_dispatch() {
        assert_eq!(
            helper_main(&args(&["/usr/bin/agentvm", "state", "x"])),
            None
        );
        assert_eq!(helper_main(&args(&[])), None);
        // As a helper, bad arguments are an error exit, not agentvm.
        assert_eq!(
            helper_main(&args(&["/x/.idmap-1/newuidmap", "nope", ""])),
            Some(1)
        );
    }

    #[test]
    fn parse_builds_one_line_per_range() {
        let (pid, map) = parse(
            Kind::Uid,
            &args(&["42", "0", "100000", "1000", "1000", "300000", "1"]),
        )
        .unwrap();
        assert_eq!(pid, 42);
        assert_eq!(map, "0 100000 1000\n1000 300000 1\n");
    }

    #[test]
    fn parse_rejects_bad_input() {
        assert!(matches!(
            parse(Kind::Gid, &args(&[])),
            Err(IdMapError::Usage(_))
        ));
        assert!(matches!(
            parse(Kind::Gid, &args(&["42", "0", "1"])),
            Err(IdMapError::Usage(_))
        ));
        assert!(matches!(
            parse(Kind::Gid, &args(&["0", "0", "1", "1"])),
            Err(IdMapError::Invalid { what: "pid", .. })
        ));
        assert!(matches!(
            parse(Kind::Gid, &args(&["42", "0", "-1", "1"])),
            Err(IdMapError::Invalid { .. })
        ));
    }

    fn spec(json: serde_json::Value) -> Spec {
        let mut s = SpecBuilder::default().build().unwrap();
        s.set_linux(Some(serde_json::from_value(json).unwrap()));
        s
    }

    #[test]
    fn helpers_only_for_multi_range_maps_of_a_new_user_namespace() {
        let one = serde_json::json!([{"containerID": 0, "hostID": 1000, "size": 10}]);
        let two = serde_json::json!([
            {"containerID": 0, "hostID": 1000, "size": 10},
            {"containerID": 10, "hostID": 5000, "size": 1}
        ]);
        let ns = serde_json::json!([{"type": "user"}]);
        let joined = serde_json::json!([{"type": "user", "path": "/proc/1/ns/user"}]);
        let s = |ns: &serde_json::Value, u: &serde_json::Value, g: &serde_json::Value| {
            spec(serde_json::json!({"namespaces": ns, "uidMappings": u, "gidMappings": g}))
        };
        assert!(!needs_helpers(&s(&ns, &one, &one)));
        assert!(needs_helpers(&s(&ns, &two, &one)));
        assert!(needs_helpers(&s(&ns, &one, &two)));
        assert!(!needs_helpers(&s(&joined, &two, &two)));
        assert!(!needs_helpers(&SpecBuilder::default().build().unwrap()));
    }

    #[test]
    fn map_is_written_in_one_go_to_a_new_user_namespace() {
        if !privileged() {
            eprintln!("skipped: writing another process's uid_map needs root");
            return;
        }
        // A child in its own user namespace that says so, then waits on a
        // pipe until its map is written; the helper writes two ranges.
        let mut child = match std::process::Command::new("/usr/bin/unshare")
            .args([
                "--user",
                "/bin/sh",
                "-c",
                "echo ready; read x; cat /proc/self/uid_map",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("skipped: cannot run unshare: {e}");
                return;
            }
        };
        let mut out = io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line, "ready\n");
        let res = write_map(Kind::Uid, child.id(), "0 100000 1000\n1000 300000 1\n");
        let mut stdin = child.stdin.take().unwrap();
        let _ = stdin.write_all(b"\n");
        drop(stdin);
        let mut text = String::new();
        io::Read::read_to_string(&mut out, &mut text).unwrap();
        let _ = child.wait();
        res.unwrap();
        let lines: Vec<String> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(lines, vec!["0 100000 1000", "1000 300000 1"]);
    }
}
