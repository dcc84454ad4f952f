//! The shared libraries a binary loads, as the dynamic loader finds them:
//! what its jail must hold besides the binary itself.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::JailError;

/// Where the lists are kept between VMs: RAM-backed, root's only. Running
/// `ldd` costs tens of milliseconds on every boot; a stat of each listed
/// file is enough to know a list still holds.
const CACHE_DIR: &str = "/run/agentvm-vmm-libs";

/// The paths of the libraries `binary` needs (its loader included), as
/// `ldd` resolves them on this host; none for a static binary. The binary
/// is one the operator configured (QEMU), trusted as any program we run.
pub fn dependencies(binary: &Path) -> Result<Vec<PathBuf>, JailError> {
    dependencies_cached(binary, Path::new(CACHE_DIR))
}

/// What identifies a file's contents without reading them: device, inode,
/// size and modification time of what `path` names (links followed).
fn signature(path: &Path) -> Option<String> {
    let m = std::fs::metadata(path).ok()?;
    Some(format!(
        "{:x}-{:x}-{:x}-{:x}.{:x}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec()
    ))
}

/// The list kept for `binary` under `cache`, if it is there and every
/// file in it is still the one it was (an upgraded library, a changed
/// link, a new binary: a new list).
fn cached(file: &Path) -> Option<Vec<PathBuf>> {
    let text = std::fs::read_to_string(file).ok()?;
    let mut paths = Vec::new();
    for line in text.lines() {
        let (sig, path) = line.split_once(' ')?;
        let path = PathBuf::from(path);
        if !path.is_absolute() || signature(&path).as_deref() != Some(sig) {
            return None;
        }
        paths.push(path);
    }
    Some(paths)
}

/// Keeps `paths` for the next VM; a failure only costs the next one an
/// `ldd`.
fn store(cache: &Path, file: &Path, paths: &[PathBuf]) {
    use std::os::unix::fs::DirBuilderExt;
    let mut text = String::new();
    for p in paths {
        let Some(sig) = signature(p) else {
            return;
        };
        text.push_str(&format!("{sig} {}\n", p.display()));
    }
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(cache);
    let tmp = file.with_extension(format!("tmp.{}", std::process::id()));
    if std::fs::write(&tmp, text).is_err() || std::fs::rename(&tmp, file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn dependencies_cached(binary: &Path, cache: &Path) -> Result<Vec<PathBuf>, JailError> {
    let entry = signature(binary).map(|sig| cache.join(format!("{sig}.list")));
    if let Some(paths) = entry.as_deref().and_then(cached) {
        return Ok(paths);
    }
    let paths = ldd(binary)?;
    if let Some(file) = &entry {
        store(cache, file, &paths);
    }
    Ok(paths)
}

fn ldd(binary: &Path) -> Result<Vec<PathBuf>, JailError> {
    let err = |detail: String| JailError::Libraries {
        binary: binary.to_path_buf(),
        detail,
    };
    let out = Command::new("ldd")
        .arg(binary)
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| err(format!("cannot run ldd (Debian package libc-bin): {e}")))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if stdout.contains("not a dynamic executable")
            || stderr.contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        return Err(err(format!("ldd {}: {}", out.status, stderr.trim())));
    }
    parse_ldd(&stdout).map_err(err)
}

/// The absolute paths in `ldd`'s output. A library it could not find is
/// an error naming it: the VMM would not start in its jail either.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>, String> {
    let mut paths = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        // "libfoo.so.1 => /lib/x86_64-linux-gnu/libfoo.so.1 (0x...)",
        // "/lib64/ld-linux-x86-64.so.2 (0x...)", "linux-vdso.so.1 (0x...)".
        let target = match line.split_once("=>") {
            Some((name, target)) => {
                let target = target.trim();
                if target.starts_with("not found") {
                    return Err(format!("{} not found", name.trim()));
                }
                target
            }
            None => line,
        };
        let path = target.split(" (").next().unwrap_or_default().trim();
        if path.starts_with('/') {
            paths.push(PathBuf::from(path));
        }
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_paths_the_loader_opens() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd1b5f3000)\n\
                    \tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x00007f0e2c1d0000)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0e2bfef000)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f0e2c226000)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        let missing = "\tlibnope.so.3 => not found\n";
        assert_eq!(parse_ldd(missing).unwrap_err(), "libnope.so.3 not found");
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
    }

    #[test]
    fn a_dynamic_binary_has_its_loader_and_libc() {
        let Some(sh) = ["/bin/sh", "/usr/bin/sh"]
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
        else {
            eprintln!("skipped: no /bin/sh");
            return;
        };
        let cache = tempfile::tempdir().expect("tempdir");
        let Ok(deps) = dependencies_cached(sh, cache.path()) else {
            eprintln!("skipped: no ldd");
            return;
        };
        if deps.is_empty() {
            eprintln!("skipped: {} is static", sh.display());
            return;
        }
        assert!(
            deps.iter()
                .any(|p| p.to_string_lossy().contains("ld-linux")),
            "{deps:?}"
        );
        assert!(deps.iter().all(|p| p.is_absolute()), "{deps:?}");
    }

    #[test]
    fn the_list_is_kept_and_checked_before_it_is_used() {
        let Some(sh) = ["/bin/sh", "/usr/bin/sh"]
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
        else {
            eprintln!("skipped: no /bin/sh");
            return;
        };
        let cache = tempfile::tempdir().expect("tempdir");
        let Ok(first) = dependencies_cached(sh, cache.path()) else {
            eprintln!("skipped: no ldd");
            return;
        };
        let file = cache
            .path()
            .join(format!("{}.list", signature(sh).expect("signature")));
        assert_eq!(cached(&file), Some(first.clone()), "kept");
        assert_eq!(dependencies_cached(sh, cache.path()).unwrap(), first);
        // A file that is not what it was makes the list stale: ldd again.
        if let Some(p) = first.first() {
            let text = std::fs::read_to_string(&file).expect("list");
            let stale = text.replacen(&signature(p).expect("sig"), "0-0-0-0.0", 1);
            std::fs::write(&file, stale).expect("write");
            assert_eq!(cached(&file), None);
            assert_eq!(dependencies_cached(sh, cache.path()).unwrap(), first);
            assert_eq!(cached(&file), Some(first), "kept again");
        }
        std::fs::write(&file, "garbage").expect("write");
        assert_eq!(cached(&file), None);
    }
}
