//! A state root, a bundle on the shared busybox rootfs and a log of their
//! own, removed at the end; agentvm driven directly (no client between),
//! and what the tests check after it: one clear error, nothing left.

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::cmd::Output;

/// Longest any one command may take (a microVM boots under TCG here).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// A state root, a bundle and a log of their own, removed at the end.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    /// Global flags before every command (`--isolation`, `--config`).
    global: Vec<String>,
}

impl Drop for Fixture {
    /// A test that fails part-way still ends its containers: each one left
    /// in the fixture's state root is force-deleted before the directory
    /// goes (nothing is left for a test that deleted its own).
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(self.root()) else {
            return;
        };
        for entry in entries.flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            // Containers only: not the pool's `.~pool`, nor a lock file.
            if !entry.path().is_dir() || id.starts_with('.') {
                continue;
            }
            let _ = self
                .command(&["delete", "--force", &id])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Fixture {
    /// A fixture for the container tier.
    // Not `Default`: it creates a directory and a bundle on disk.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Fixture {
        Fixture::with_flags(&["--isolation=container"])
    }

    /// A fixture whose commands all get `global` flags first.
    pub fn with_flags(global: &[&str]) -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("agentvm-cli-")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir(dir.path().join("root")).expect("root");
        let f = Fixture {
            dir,
            global: global.iter().map(|s| s.to_string()).collect(),
        };
        f.write_config(&["true"], |_| {});
        f
    }

    /// Adds global flags (after the ones given at construction).
    pub fn add_flags(&mut self, flags: &[&str]) {
        self.global.extend(flags.iter().map(|s| s.to_string()));
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn bundle(&self) -> PathBuf {
        self.dir.path().join("bundle")
    }

    pub fn log(&self) -> PathBuf {
        self.dir.path().join("log.json")
    }

    /// Writes a config.json for `args` on the shared busybox rootfs,
    /// letting `edit` change the JSON first.
    pub fn write_config(&self, args: &[&str], edit: impl FnOnce(&mut serde_json::Value)) {
        let bundle = self.bundle();
        std::fs::create_dir_all(&bundle).expect("bundle");
        let rootfs = super::rootfs::unpacked();
        let mut config = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": {"uid": 0, "gid": 0},
                "args": args,
                "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
                "cwd": "/",
                "noNewPrivileges": true
            },
            "root": {"path": rootfs, "readonly": true},
            "hostname": "cli-test",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                 "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}
            ],
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"},
                               {"type": "mount"}, {"type": "network"}]
            }
        });
        edit(&mut config);
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&config).expect("json"),
        )
        .expect("write config");
    }

    /// Changes the bundle's config.json as it is now (after
    /// [`Fixture::write_config`] or a helper built on it).
    pub fn edit_config(&self, edit: impl FnOnce(&mut serde_json::Value)) {
        let path = self.bundle().join("config.json");
        let text = std::fs::read(&path).expect("read config.json");
        let mut config: serde_json::Value = serde_json::from_slice(&text).expect("config json");
        edit(&mut config);
        std::fs::write(&path, serde_json::to_vec_pretty(&config).expect("json"))
            .expect("write config.json");
    }

    /// The agentvm command for `args` with this fixture's state root, log
    /// and global flags, for a test that runs it its own way (and tells an
    /// exit code from a death by signal, which [`Fixture::agentvm`] folds
    /// into one number).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(super::agentvm_bin());
        cmd.arg("--root")
            .arg(self.root())
            .arg("--log")
            .arg(self.log())
            .arg("--log-format")
            .arg("json")
            .args(&self.global)
            .args(args);
        cmd
    }

    /// Runs agentvm with stdout and stderr in files, not pipes: a created
    /// container's init inherits them and keeps them open, so a pipe would
    /// not reach EOF until the container ends (with runc as well).
    pub fn agentvm(&self, args: &[&str]) -> Output {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let out_path = self.dir.path().join(format!("out.{n}"));
        let err_path = self.dir.path().join(format!("err.{n}"));
        let mut cmd = self.command(args);
        cmd.stdin(Stdio::null())
            .stdout(File::create(&out_path).expect("stdout file"))
            .stderr(File::create(&err_path).expect("stderr file"));
        let command = super::cmd::describe(&cmd);
        let mut child = cmd.spawn().expect("spawn agentvm");
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break st;
            }
            if Instant::now() >= deadline {
                // What it waits on, read before the kill ends it.
                let report = self.hang_report(child.id());
                let _ = child.kill();
                let _ = child.wait();
                panic!("`{command}` hung\n{report}");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Output {
            command,
            code: status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
            stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
            stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        }
    }

    /// What a hung command and everything it started were doing: each
    /// process's and thread's state, wait channel and system call, its
    /// stderr so far, the end of the log and of every guest console in the
    /// state root. A hang that CI meets once is found from this.
    fn hang_report(&self, pid: u32) -> String {
        let mut out = String::from("processes below the command:\n");
        for p in super::cmd::descendants(pid) {
            out.push_str(&super::cmd::threads_of(p));
        }
        let tail = |path: &std::path::Path, n: usize| {
            let bytes = std::fs::read(path).unwrap_or_default();
            String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(n)..]).into_owned()
        };
        out.push_str(&format!(
            "log, last 3000 bytes:\n{}\n",
            tail(&self.log(), 3000)
        ));
        for entry in std::fs::read_dir(self.root())
            .into_iter()
            .flatten()
            .flatten()
        {
            // A supervisor has left the command's tree (it daemonizes).
            let state = std::fs::read(entry.path().join("microvm.json")).unwrap_or_default();
            let supervisor = serde_json::from_slice::<serde_json::Value>(&state)
                .ok()
                .and_then(|v| v["supervisor_pid"].as_u64());
            if let Some(sup) = supervisor {
                out.push_str(&format!(
                    "supervisor of {} and what it started:\n",
                    entry.file_name().to_string_lossy()
                ));
                for p in super::cmd::descendants(sup as u32) {
                    out.push_str(&super::cmd::threads_of(p));
                }
            }
            let console = entry.path().join("console.log");
            if console.exists() {
                out.push_str(&format!(
                    "console of {}, last 2000 bytes:\n{}\n",
                    entry.file_name().to_string_lossy(),
                    tail(&console, 2000)
                ));
            }
        }
        out
    }

    pub fn create(&self, id: &str) -> Output {
        let bundle = self.bundle();
        self.agentvm(&["create", "--bundle", bundle.to_str().expect("utf-8"), id])
    }

    /// The parts of the boot trace a microvm `create` recorded, in order
    /// (`boot` in the container's `microvm.json`).
    pub fn boot_parts(&self, id: &str) -> Vec<String> {
        let text = std::fs::read(self.root().join(id).join("microvm.json")).expect("microvm.json");
        let state: serde_json::Value = serde_json::from_slice(&text).expect("json");
        state["boot"]
            .as_array()
            .expect("boot trace")
            .iter()
            .map(|p| p["part"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    pub fn state(&self, id: &str) -> serde_json::Value {
        let out = self.agentvm(&["state", id]).ok();
        serde_json::from_str(&out.stdout).expect("state is JSON")
    }

    /// Entries left in the state root (hidden files included).
    pub fn leftovers(&self) -> Vec<String> {
        std::fs::read_dir(self.root())
            .expect("read root")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }
}

pub fn skip_unless_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (namespaces, cgroups)");
        return true;
    }
    false
}

/// Every cgroup directory named `id` under any mounted hierarchy.
pub fn cgroups_named(id: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                // libcontainer names a cgroup without cgroupsPath ":youki:<id>".
                if names_container(&e.file_name().to_string_lossy(), id) {
                    found.push(e.path());
                }
                if dir.components().count() < 8 {
                    stack.push(e.path());
                }
            }
        }
    }
    found
}

/// Whether a cgroup's directory name holds the container id `id` as a
/// whole word (`c1`, `:youki:c1`, `agentvm-c1.scope`), not as a prefix of
/// another test's id (`pool-a` in `pool-after`).
fn names_container(name: &str, id: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || "_+-".contains(c));
    name.match_indices(id).any(|(at, _)| {
        !alnum(name[..at].chars().next_back()) && !word(name[at + id.len()..].chars().next())
    })
}

/// When a process started, in clock ticks since boot (field 22 of its
/// `stat`; `comm` may hold spaces and parentheses, so count from its end).
fn started_at(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Processes whose command line mentions `marker`, among those started
/// since this test binary: a process that was there before it (a shell
/// on the machine whose script happens to mention a container's name) is
/// none of its leftovers.
pub fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    let since = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| started_at(&s))
        .unwrap_or(0);
    for e in std::fs::read_dir("/proc")
        .expect("proc")
        .filter_map(|e| e.ok())
    {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        if started_at(&stat).is_some_and(|t| t < since) {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) {
                // "pid (comm) state ppid" first: a failure's excerpt is
                // short, and these say what the process is.
                let head: Vec<&str> = stat.split_whitespace().take(4).collect();
                let text: String = text.chars().take(160).collect();
                found.push(format!("{}: {text}", head.join(" ")));
            }
        }
    }
    found
}

/// The children of `parent` as "pid: command line", as [`processes_with`]
/// shows processes.
pub fn children_of(parent: i32) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc")
        .expect("proc")
        .filter_map(|e| e.ok())
    {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid …; comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push(format!("{}: {text}", e.file_name().to_string_lossy()));
        }
    }
    found
}

/// One failed command: non-zero, one stderr line naming the problem, the
/// same message as a JSON error line in the log.
#[track_caller]
pub fn assert_one_clear_error(f: &Fixture, out: &Output, needle: &str) {
    assert_ne!(out.code, 0, "expected failure:\n{out}");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one stderr line:\n{out}");
    assert!(
        lines[0].contains(needle),
        "stderr should name {needle:?}:\n{out}"
    );
    let log = std::fs::read_to_string(f.log()).expect("log file written");
    let last = log.lines().last().expect("log has a line");
    let entry: serde_json::Value = serde_json::from_str(last).expect("log line is JSON");
    assert_eq!(entry["level"], "error", "{last}");
    assert!(
        entry["msg"].as_str().unwrap_or("").contains(needle),
        "{last}"
    );
    assert!(entry["time"].is_string(), "{last}");
}

#[track_caller]
pub fn assert_nothing_left(f: &Fixture, id: &str) {
    assert_eq!(f.leftovers(), Vec::<String>::new(), "state root not empty");
    assert_eq!(cgroups_named(id), Vec::<PathBuf>::new(), "cgroup left");
    assert_eq!(processes_naming(id), Vec::<String>::new(), "process left");
}

/// Processes whose command line names container `id` as a whole word
/// (`/root/pool-a/console.sock`, `supervise pool-a`), not as a prefix of
/// another test's id (`pool-after`), as [`processes_with`] shows them.
pub fn processes_naming(id: &str) -> Vec<String> {
    processes_with(id)
        .into_iter()
        .filter(|p| {
            let cmdline = p.split_once(": ").map_or(p.as_str(), |(_, c)| c);
            names_container(cmdline, id)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cgroup_names_an_id_as_a_whole_word() {
        for name in ["pool-a", ":youki:pool-a", "agentvm-pool-a.scope"] {
            assert!(super::names_container(name, "pool-a"), "{name}");
        }
        for name in ["pool-after", "xpool-a", "pool-a-2", "pool"] {
            assert!(!super::names_container(name, "pool-a"), "{name}");
        }
    }
}
