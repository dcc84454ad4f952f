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
    if path.is_file() {
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
    std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&image))
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(write_err)?;
    Ok(path)
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
