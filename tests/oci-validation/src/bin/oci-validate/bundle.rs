//! Bundles: a rootfs made of busybox and the checker, and a config.json.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use oci_validation::expect::Expectations;
use oci_validation::{CHECKER_PATH, EXPECT_PATH};
use serde_json::{json, Value};

/// Directories of the template rootfs and their modes.
const DIRS: &[(&str, u32)] = &[
    ("bin", 0o755),
    ("sbin", 0o755),
    ("etc", 0o755),
    ("proc", 0o555),
    ("sys", 0o555),
    ("dev", 0o755),
    ("tmp", 0o1777),
    ("root", 0o700),
    ("home", 0o755),
    ("home/user", 0o755),
    ("mnt", 0o755),
    ("run", 0o755),
    ("var", 0o755),
];

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
user:x:1000:1000:user:/home/user:/bin/sh\n\
nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
const GROUP: &str = "root:x:0:\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n";

/// Builds the template rootfs once: busybox with its applet links, the
/// checker, /etc/passwd and /etc/group.
pub fn make_template(dir: &Path, busybox: &Path, checker: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    set_mode(dir, 0o755)?;
    for (d, mode) in DIRS {
        let p = dir.join(d);
        std::fs::create_dir_all(&p).with_context(|| format!("create {}", p.display()))?;
        set_mode(&p, *mode)?;
    }
    std::os::unix::fs::chown(dir.join("home/user"), Some(1000), Some(1000))
        .context("chown home/user")?;
    ensure_static(busybox)?;
    ensure_static(checker)?;
    copy_exec(busybox, &dir.join("bin/busybox"))?;
    copy_exec(checker, &dir.join(CHECKER_PATH.trim_start_matches('/')))?;
    let list = Command::new(busybox)
        .arg("--list")
        .output()
        .with_context(|| format!("{} --list", busybox.display()))?;
    if !list.status.success() {
        bail!("{} --list failed", busybox.display());
    }
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let applet = applet.trim();
        if applet.is_empty() || applet == "busybox" || applet.contains('/') {
            continue;
        }
        let link = dir.join("bin").join(applet);
        symlink("busybox", &link).with_context(|| format!("symlink {}", link.display()))?;
    }
    std::fs::write(dir.join("etc/passwd"), PASSWD).context("write etc/passwd")?;
    std::fs::write(dir.join("etc/group"), GROUP).context("write etc/group")?;
    for f in ["etc/passwd", "etc/group"] {
        set_mode(&dir.join(f), 0o644)?;
    }
    Ok(())
}

/// Refuses an ELF executable with a program interpreter: a dynamically
/// linked binary cannot run in a rootfs that has no libc.
fn ensure_static(path: &Path) -> Result<()> {
    const PT_INTERP: u32 = 3;
    let elf = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    // 64-bit little-endian ELF only: e_phoff at 0x20, e_phentsize at 0x36, e_phnum at 0x38.
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        bail!(
            "{} is not a 64-bit little-endian ELF executable",
            path.display()
        );
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        bail!("{}: truncated ELF header", path.display());
    };
    let phoff = usize::try_from(phoff)?;
    for i in 0..usize::from(phnum) {
        if u32_at(phoff + i * usize::from(phentsize)) == Some(PT_INTERP) {
            bail!(
                "{} is dynamically linked; the rootfs needs a static binary (busybox-static)",
                path.display()
            );
        }
    }
    Ok(())
}

fn copy_exec(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
    set_mode(to, 0o755)
}

pub fn set_mode(p: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", p.display()))
}

/// Copies the template tree: directories and symlinks anew, regular files as
/// hard links (the same filesystem) so a bundle costs almost nothing.
fn clone_tree(from: &Path, to: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(from)?;
    std::fs::create_dir(to).with_context(|| format!("create {}", to.display()))?;
    std::fs::set_permissions(to, meta.permissions())?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let ft = entry.file_type()?;
        if ft.is_dir() {
            clone_tree(&src, &dst)?;
            let m = std::fs::symlink_metadata(&src)?;
            use std::os::unix::fs::MetadataExt;
            std::os::unix::fs::chown(&dst, Some(m.uid()), Some(m.gid()))?;
        } else if ft.is_symlink() {
            symlink(std::fs::read_link(&src)?, &dst)?;
        } else if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst)
                .with_context(|| format!("copy {} to {}", src.display(), dst.display()))?;
        }
    }
    Ok(())
}

/// A bundle directory with its config, written on demand.
#[derive(Debug)]
pub struct Bundle {
    pub dir: PathBuf,
    pub config: Value,
}

impl Bundle {
    /// A new bundle at `dir` with a rootfs cloned from `template` and the
    /// base config.
    pub fn create(dir: PathBuf, template: &Path) -> Result<Bundle> {
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        set_mode(&dir, 0o755)?;
        clone_tree(template, &dir.join("rootfs"))
            .with_context(|| format!("populate {}/rootfs", dir.display()))?;
        Ok(Bundle {
            dir,
            config: base_config(),
        })
    }

    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    pub fn dir_str(&self) -> String {
        self.dir.to_string_lossy().into_owned()
    }

    /// Sets the value at a JSON pointer, creating objects on the way.
    pub fn set(&mut self, pointer: &str, value: Value) {
        set_pointer(&mut self.config, pointer, value);
    }

    /// Appends to the array at a JSON pointer, creating it when missing.
    pub fn push(&mut self, pointer: &str, value: Value) {
        let slot = slot(&mut self.config, pointer);
        if !slot.is_array() {
            *slot = Value::Array(Vec::new());
        }
        if let Value::Array(a) = slot {
            a.push(value);
        }
    }

    /// Removes an entry of an object, e.g. `remove("/linux", "seccomp")`.
    pub fn remove(&mut self, pointer: &str, key: &str) {
        if let Some(Value::Object(o)) = self.config.pointer_mut(pointer) {
            o.remove(key);
        }
    }

    /// Keeps only the namespaces of the given types.
    pub fn keep_namespaces(&mut self, keep: &[&str]) {
        if let Some(Value::Array(a)) = self.config.pointer_mut("/linux/namespaces") {
            a.retain(|ns| {
                ns.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| keep.contains(&t))
            });
        }
    }

    /// Sets process.args.
    pub fn args(&mut self, args: &[&str]) {
        self.set("/process/args", json!(args));
    }

    /// Writes config.json.
    pub fn write(&self) -> Result<()> {
        let p = self.dir.join("config.json");
        std::fs::write(&p, serde_json::to_vec_pretty(&self.config)?)
            .with_context(|| format!("write {}", p.display()))
    }

    /// Writes the expectations file into the rootfs at `path`.
    pub fn write_expect_at(&self, path: &str, exp: &Expectations) -> Result<()> {
        let p = self.rootfs().join(path.trim_start_matches('/'));
        std::fs::write(&p, serde_json::to_vec(exp)?)
            .with_context(|| format!("write {}", p.display()))?;
        set_mode(&p, 0o644)
    }

    /// Writes the default expectations file into the rootfs.
    pub fn write_expect(&self, exp: &Expectations) -> Result<()> {
        self.write_expect_at(EXPECT_PATH, exp)
    }
}

fn slot<'a>(root: &'a mut Value, pointer: &str) -> &'a mut Value {
    let mut cur = root;
    for key in pointer.split('/').skip(1) {
        if !cur.is_object() && !cur.is_array() {
            *cur = Value::Object(serde_json::Map::new());
        }
        cur = match cur {
            Value::Array(a) => match key.parse::<usize>() {
                Ok(i) if i < a.len() => &mut a[i],
                _ => {
                    a.push(Value::Null);
                    let last = a.len() - 1;
                    &mut a[last]
                }
            },
            Value::Object(o) => o.entry(key.to_string()).or_insert(Value::Null),
            other => other,
        };
    }
    cur
}

fn set_pointer(root: &mut Value, pointer: &str, value: Value) {
    *slot(root, pointer) = value;
}

/// The capabilities `runc spec` grants, without ambient ones.
pub const DEFAULT_CAPS: &[&str] = &["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"];

/// The masked paths `runc spec` writes.
pub const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
];

/// The read-only paths `runc spec` writes.
pub const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The configuration every case starts from: `runc spec`'s, with the checker
/// as the workload, no terminal and a writable root.
pub fn base_config() -> Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": [CHECKER_PATH, EXPECT_PATH],
            "env": ["PATH=/bin:/sbin", "TERM=xterm"],
            "cwd": "/",
            "capabilities": {
                "bounding": DEFAULT_CAPS,
                "effective": DEFAULT_CAPS,
                "permitted": DEFAULT_CAPS
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs", "readonly": false},
        "hostname": "oci-validate",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
             "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
             "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}
        ],
        "linux": {
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "namespaces": [
                {"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                {"type": "uts"}, {"type": "mount"}
            ],
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_creates_intermediate_objects() {
        let mut v = json!({"a": {"b": 1}});
        set_pointer(&mut v, "/a/c/d", json!(2));
        assert_eq!(v, json!({"a": {"b": 1, "c": {"d": 2}}}));
        set_pointer(&mut v, "/a/b", json!([1, 2]));
        set_pointer(&mut v, "/a/b/1", json!(5));
        assert_eq!(v["a"]["b"], json!([1, 5]));
    }

    #[test]
    fn dynamic_binaries_are_refused() {
        // The test binary itself is static here (crt-static); a shell script
        // is not ELF at all.
        let me = std::env::current_exe().unwrap();
        assert!(ensure_static(&me).is_ok());
        let script = std::env::temp_dir().join(format!("ov-not-elf-{}", std::process::id()));
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        assert!(ensure_static(&script).is_err());
        std::fs::remove_file(&script).unwrap();
    }

    #[test]
    fn base_config_is_runc_shaped() {
        let c = base_config();
        assert_eq!(c["process"]["args"][0], CHECKER_PATH);
        assert_eq!(c["linux"]["namespaces"].as_array().unwrap().len(), 5);
        assert_eq!(c["mounts"].as_array().unwrap().len(), 7);
    }
}
