//! The image the network part runs: the tests' busybox rootfs plus the
//! host's own `iperf3` and `wrk` with the shared libraries `ldd` lists, a
//! page for `httpd` to serve and the Lua script that makes `wrk` print its
//! figures in one parseable line. Made with `docker import` (no registry
//! is reachable), re-imported only when one of its inputs changed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::cmd;
use crate::common::docker::Docker;
use crate::common::{find_in_path, rootfs};

/// The image's name on the test dockerd.
pub const IMAGE: &str = "local/agentvm-bench-net";
/// Where `wrk`'s report script is, in the image (and under the bench
/// directory on the host).
pub const WRK_SCRIPT: &str = "/wrk-report.lua";
/// What `httpd` serves at `/`: a small page, as an API answer would be.
pub const PAGE: &str = "hello from the benchmark's container\n";
/// Label recording what the image was made from.
const LABEL: &str = "io.agentvm.bench.net";
/// Bumped when the image's layout changes.
const LAYOUT: u32 = 1;

/// `wrk`'s `done` hook: one line of integers after wrk's own report.
/// Latencies are wrk's: from the request written to the response read
/// (the connection is already established).
pub const WRK_LUA: &str = r#"done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "\navmbench-wrk requests=%d duration_us=%d errors=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"#;

/// The host's network tools, or why each is missing.
pub struct Tools {
    pub iperf3: Result<PathBuf, String>,
    pub wrk: Result<PathBuf, String>,
}

impl Tools {
    pub fn find() -> Tools {
        let find = |name: &str| {
            find_in_path(name).ok_or_else(|| format!("{name} is not installed (make deps)"))
        };
        Tools {
            iperf3: find("iperf3"),
            wrk: find("wrk"),
        }
    }

    /// ("iperf3", first line of its version) and the same for wrk.
    pub fn versions(&self) -> Vec<(String, String)> {
        let first_line = |tool: &Result<PathBuf, String>, flag: &str| match tool {
            // wrk prints its version and usage, and exits 1.
            Ok(p) => Command::new(p)
                .arg(flag)
                .output()
                .map(|o| {
                    let text = String::from_utf8_lossy(&o.stdout).into_owned();
                    text.lines().next().unwrap_or("unknown").trim().to_string()
                })
                .unwrap_or_else(|e| format!("unknown ({e})")),
            Err(why) => why.clone(),
        };
        vec![
            ("iperf3".into(), first_line(&self.iperf3, "--version")),
            ("wrk".into(), first_line(&self.wrk, "-v")),
        ]
    }

    fn present(&self) -> impl Iterator<Item = &Path> {
        [&self.iperf3, &self.wrk]
            .into_iter()
            .filter_map(|t| t.as_deref().ok())
    }
}

fn mtime(path: &Path) -> String {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map(|t| format!("{t:?}"))
        .unwrap_or_else(|e| format!("({e})"))
}

/// Runs a setup command, its output in the error when it fails.
fn setup(cmd: &mut Command) -> Result<String, String> {
    let out = cmd::try_run_with(cmd, None, Duration::from_secs(300))?;
    if !out.success() {
        return Err(out.to_string());
    }
    Ok(out.stdout)
}

/// The files `ldd` says `bin` loads: libraries and the dynamic loader.
fn libraries(bin: &Path) -> Result<Vec<PathBuf>, String> {
    let text = setup(Command::new("ldd").arg(bin))?;
    let mut libs = Vec::new();
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        match path {
            Some(p) if p.starts_with('/') => libs.push(PathBuf::from(p)),
            _ => {}
        }
    }
    Ok(libs)
}

/// Copies `src` (following links) to the same path under `root`.
fn copy_in(root: &Path, src: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let rel = src.strip_prefix("/").unwrap_or(src);
    let dst = root.join(rel);
    if let Some(dir) = dst.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    }
    std::fs::copy(src, &dst)
        .map_err(|e| format!("copy {} to {}: {e}", src.display(), dst.display()))?;
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", dst.display()))
}

/// Makes sure [`IMAGE`] exists and is current; writes the host copy of
/// the wrk script under `dir` and returns its path.
pub fn ensure(d: &Docker, tools: &Tools, dir: &Path) -> Result<PathBuf, String> {
    let work = dir.join("net-image");
    std::fs::create_dir_all(&work).map_err(|e| format!("mkdir {}: {e}", work.display()))?;
    let script = work.join("wrk-report.lua");
    std::fs::write(&script, WRK_LUA).map_err(|e| format!("write {}: {e}", script.display()))?;

    let busybox = rootfs::tarball();
    let mut stamp = format!("layout {LAYOUT}; busybox {}", mtime(&busybox));
    for t in tools.present() {
        stamp.push_str(&format!("; {} {}", t.display(), mtime(t)));
    }
    let label = format!("{{{{index .Config.Labels \"{LABEL}\"}}}}");
    let current = d
        .cmd()
        .args(["image", "inspect", "--format", &label, IMAGE])
        .output();
    if let Ok(o) = current {
        if o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == stamp {
            return Ok(script);
        }
    }

    let root = work.join("rootfs");
    if root.exists() {
        std::fs::remove_dir_all(&root).map_err(|e| format!("rm {}: {e}", root.display()))?;
    }
    std::fs::create_dir_all(&root).map_err(|e| format!("mkdir {}: {e}", root.display()))?;
    setup(
        Command::new("tar")
            .arg("--numeric-owner")
            .arg("-xpf")
            .arg(&busybox)
            .arg("-C")
            .arg(&root),
    )?;
    for t in tools.present() {
        copy_in(&root, t, 0o755)?;
        for lib in libraries(t)? {
            copy_in(&root, &lib, 0o755)?;
        }
    }
    let www = root.join("www");
    std::fs::create_dir_all(&www).map_err(|e| format!("mkdir {}: {e}", www.display()))?;
    std::fs::write(www.join("index.html"), PAGE).map_err(|e| format!("write page: {e}"))?;
    let in_image = root.join(WRK_SCRIPT.trim_start_matches('/'));
    std::fs::write(&in_image, WRK_LUA).map_err(|e| format!("write wrk script: {e}"))?;

    let tar = work.join("image.tar");
    setup(
        Command::new("tar")
            .arg("--numeric-owner")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
    )?;
    let change = format!("LABEL {LABEL}=\"{stamp}\"");
    setup(
        d.cmd()
            .arg("import")
            .arg("--change")
            .arg(&change)
            .arg(&tar)
            .arg(IMAGE),
    )?;
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_file(&tar);
    Ok(script)
}
