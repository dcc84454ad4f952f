//! The busybox root filesystem every test image is made from.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{cmd, daemon, DATA_DIR};

/// Name of the image the Docker and Podman tests import.
pub const IMAGE: &str = "local/busybox";

/// The build script, in the source tree.
fn script() -> PathBuf {
    super::repo_root().join("tests/images/busybox-rootfs.sh")
}

/// Builds (once) the rootfs tarball with `tests/images/busybox-rootfs.sh`
/// and returns its path. Rebuilt when the script is newer than the tarball.
pub fn tarball() -> PathBuf {
    std::fs::create_dir_all(DATA_DIR).expect("create data dir");
    let _lock = daemon::lock(&Path::new(DATA_DIR).join("rootfs.lock"));
    let tar = Path::new(DATA_DIR).join("busybox-rootfs.tar");
    let script = script();
    let fresh = match (std::fs::metadata(&tar), std::fs::metadata(&script)) {
        (Ok(t), Ok(s)) => t.modified().ok() >= s.modified().ok(),
        _ => false,
    };
    if !fresh {
        cmd::run(Command::new("sh").arg(&script).arg(&tar)).ok();
    }
    tar
}

/// An unpacked copy of the rootfs (for `ctr run --rootfs`), made once.
pub fn unpacked() -> PathBuf {
    let tar = tarball();
    let _lock = daemon::lock(&Path::new(DATA_DIR).join("rootfs.lock"));
    let dir = Path::new(DATA_DIR).join("busybox-rootfs");
    let stamp = dir.join(".unpacked-from");
    let tar_mtime = std::fs::metadata(&tar)
        .and_then(|m| m.modified())
        .map(|t| format!("{t:?}"))
        .unwrap_or_default();
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(tar_mtime.as_str()) {
        return dir;
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("remove old unpacked rootfs");
    }
    std::fs::create_dir_all(&dir).expect("create rootfs dir");
    cmd::run(
        Command::new("tar")
            .arg("--numeric-owner")
            .arg("-xpf")
            .arg(&tar)
            .arg("-C")
            .arg(&dir),
    )
    .ok();
    std::fs::write(&stamp, tar_mtime).expect("write stamp");
    dir
}
