//! The shared libraries a binary loads, as the dynamic loader finds them:
//! what its jail must hold besides the binary itself.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::JailError;

/// The paths of the libraries `binary` needs (its loader included), as
/// `ldd` resolves them on this host; none for a static binary. The binary
/// is one the operator configured (QEMU), trusted as any program we run.
pub fn dependencies(binary: &Path) -> Result<Vec<PathBuf>, JailError> {
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
        let Ok(deps) = dependencies(sh) else {
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
}
