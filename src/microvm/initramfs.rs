//! The guest's initramfs: a newc cpio holding agentvm itself as /init.
//!
//! It is made from the running binary (/proc/self/exe), so host and guest
//! always speak the same protocol, or from the binary the config file names
//! as `guest_agent`, and cached per binary.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where built initramfs images are kept (tmpfs; gone at reboot).
pub const CACHE_DIR: &str = "/run/agentvm-initramfs";

#[derive(Debug, thiserror::Error)]
pub enum InitramfsError {
    #[error("cannot read the agentvm binary {path}: {source}")]
    ReadSelf {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read the guest agent {path} (`guest_agent` under [microvm]): {source}")]
    ReadAgent {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write initramfs {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A newc ("070701") cpio archive writer.
pub struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Default for Cpio {
    fn default() -> Self {
        Cpio {
            out: Vec::new(),
            ino: 1,
        }
    }
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        let namesize = name.len() + 1;
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            if mode & 0o170000 == 0o040000 { 2 } else { 1 },
            0, // mtime: reproducible images
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            namesize as u32,
            0,
        ];
        self.ino += 1;
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    pub fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }

    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, 0o100000 | (mode & 0o7777), (0, 0), data);
    }

    pub fn char_dev(&mut self, name: &str, mode: u32, major: u32, minor: u32) {
        self.entry(name, 0o020000 | (mode & 0o7777), (major, minor), &[]);
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

/// The image for a given /init binary.
pub fn build(init: &[u8]) -> Vec<u8> {
    let mut c = Cpio::default();
    for d in ["dev", "proc", "sys", "run", "tmp"] {
        c.dir(d);
    }
    // The kernel opens /dev/console for init's stdio before devtmpfs exists.
    c.char_dev("dev/console", 0o600, 5, 1);
    c.file("init", 0o755, init);
    c.finish()
}

/// The cached image whose /init is `agent`, or the running binary when
/// `agent` is `None`; built on first use.
///
/// The cache key is the binary's identity (device, inode, size, mtime), so
/// a rebuilt binary gets a new image; images made from a configured agent
/// are named apart from those made from agentvm itself.
pub fn for_init(agent: Option<&Path>) -> Result<PathBuf, InitramfsError> {
    cached(Path::new(CACHE_DIR), agent)
}

fn cached(cache_dir: &Path, agent: Option<&Path>) -> Result<PathBuf, InitramfsError> {
    let (exe, prefix) = match agent {
        Some(p) => (p.to_path_buf(), "agent"),
        None => (PathBuf::from("/proc/self/exe"), "agentvm"),
    };
    let read_err = |source| match agent {
        Some(_) => InitramfsError::ReadAgent {
            path: exe.clone(),
            source,
        },
        None => InitramfsError::ReadSelf {
            path: exe.clone(),
            source,
        },
    };
    let meta = std::fs::metadata(&exe).map_err(read_err)?;
    let key = format!(
        "{:x}-{:x}-{:x}-{:x}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime_nsec() as u64 ^ (meta.mtime() as u64) << 20
    );
    let path = cache_dir.join(format!("{prefix}-{key}.cpio"));
    if let Ok(f) = std::fs::File::options().append(true).open(&path) {
        // In use: fresh, so that pruning leaves it alone.
        let _ = f.set_modified(std::time::SystemTime::now());
        return Ok(path);
    }
    let init = std::fs::read(&exe).map_err(read_err)?;
    let image = build(&init);
    let write_err = |source| InitramfsError::Write {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(cache_dir).map_err(write_err)?;
    let tmp = cache_dir.join(format!(".{prefix}-{key}.{}", std::process::id()));
    // Readable by others whatever the umask: the jailed VMM, which reads
    // it, runs as a uid of its own. It holds nothing secret (agentvm's
    // binary or the configured guest agent).
    std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&image))
        .and_then(|_| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
        })
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(write_err)?;
    prune(cache_dir, prefix, &path);
    Ok(path)
}

/// Images of older binaries (an upgrade, a rebuild) would pile up in the
/// RAM-backed cache: keep the newest few, and drop the rest once unused
/// for a while (a create of an older binary still running may be about to
/// hand its image to QEMU).
fn prune(cache_dir: &Path, prefix: &str, current: &Path) {
    const KEEP: usize = 2;
    const UNUSED_FOR: std::time::Duration = std::time::Duration::from_secs(600);
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return;
    };
    let mut images: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with(&format!("{prefix}-")) && name.ends_with(".cpio")
        })
        .map(|e| e.path())
        .filter(|p| p != current)
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    images.sort_by_key(|i| std::cmp::Reverse(i.0));
    let now = std::time::SystemTime::now();
    for (modified, path) in images.into_iter().skip(KEEP) {
        if now.duration_since(modified).unwrap_or_default() > UNUSED_FOR {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_layout_is_aligned_and_ends_with_trailer() {
        let img = build(b"#!/bin/sh\n");
        assert_eq!(&img[..6], b"070701");
        assert_eq!(img.len() % 4, 0);
        let text = String::from_utf8_lossy(&img);
        assert!(text.contains("TRAILER!!!"));
        assert!(text.contains("dev/console"));
        // The init entry: mode 100755, size 10.
        let at = text.find("init\0").unwrap();
        let header = &text[at - 110..at];
        assert_eq!(&header[14..22], "000081ed");
        assert_eq!(&header[54..62], "0000000a");
    }

    #[test]
    fn old_unused_images_are_pruned_and_recent_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for i in 0..5 {
            let p = cache.join(format!("agent-old{i}.cpio"));
            std::fs::write(&p, b"x").unwrap();
            let f = std::fs::File::options().append(true).open(&p).unwrap();
            f.set_modified(old - std::time::Duration::from_secs(i))
                .unwrap();
        }
        std::fs::write(cache.join("agent-recent.cpio"), b"x").unwrap();
        std::fs::write(cache.join("agentvm-other.cpio"), b"x").unwrap();
        let agent = dir.path().join("a");
        std::fs::write(&agent, b"agent-a").unwrap();
        let image = cached(&cache, Some(&agent)).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let current = image.file_name().unwrap().to_string_lossy().into_owned();
        let mut want = vec![
            "agent-old0.cpio".to_string(),
            "agent-recent.cpio".to_string(),
            "agentvm-other.cpio".to_string(),
            current,
        ];
        want.sort();
        assert_eq!(left, want);
    }

    #[test]
    fn a_configured_agent_gets_its_own_cached_image() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, b"agent-a").unwrap();
        std::fs::write(&b, b"agent-b").unwrap();
        let image_a = cached(&cache, Some(&a)).unwrap();
        let image_b = cached(&cache, Some(&b)).unwrap();
        assert_ne!(image_a, image_b);
        assert!(image_a
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("agent-"));
        assert_eq!(std::fs::read(&image_a).unwrap(), build(b"agent-a"));
        assert_eq!(std::fs::read(&image_b).unwrap(), build(b"agent-b"));
        // A hit is the same file; a missing agent is an error naming it.
        assert_eq!(cached(&cache, Some(&a)).unwrap(), image_a);
        let missing = dir.path().join("missing");
        let err = cached(&cache, Some(&missing)).unwrap_err().to_string();
        assert!(
            err.contains("guest_agent") && err.contains("missing"),
            "{err}"
        );
    }

    #[test]
    fn cpio_tool_reads_it_back() {
        if std::process::Command::new("cpio")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("skipped: cpio is not installed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("i.cpio");
        std::fs::write(&img, build(b"payload")).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("cpio -it < {}", img.display()))
            .output()
            .unwrap();
        let list = String::from_utf8_lossy(&out.stdout);
        assert!(list.contains("init"), "{list}");
        assert!(list.contains("dev/console"), "{list}");
    }
}
