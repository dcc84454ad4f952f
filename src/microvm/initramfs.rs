//! A newc cpio writer, for an initramfs: the benchmark's QEMU floor boots
//! one. A container's VM boots from its virtio-fs share instead
//! (`host::share_root`), with the agent in it.

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
