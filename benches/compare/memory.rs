//! Part (c): host memory per idle container. N containers of each runtime
//! run `sleep 1000` at the same time; once they have settled, the RSS and
//! PSS (/proc/PID/smaps_rollup) of the container's pid and every process
//! below it are summed: for agentvm's microvm tier that is the supervisor,
//! QEMU and virtiofsd, for the others the container's init. For a microVM
//! the guest memory touched is shown on its own: the guest RAM is a memfd
//! QEMU maps shared, so QEMU's RssShmem is the guest pages that were ever
//! touched.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::error::BenchError;
use crate::oci::{invoke, Workspace};
use crate::reaper::reap_orphans;
use crate::runtimes::Runtime;

/// How long the containers idle before they are measured: a microVM's
/// agent gives its page cache back 10 s after its last request and the
/// guest kernel reports freed pages to the host in passes 2 s apart
/// (`guest::trim`), so an idle microVM has settled by then.
pub const SETTLE: Duration = Duration::from_secs(16);
/// How long a container may take to be `running` after `start`.
const RUNNING_TIMEOUT_SECS: u64 = 60;

/// One process of a container, its memory in KiB.
#[derive(Debug, Clone)]
pub struct Proc {
    pub comm: String,
    pub rss: u64,
    pub pss: u64,
    /// Resident shared memory (shmem/memfd pages mapped).
    pub rss_shmem: u64,
    /// PSS of anonymous, file-backed and shmem pages (smaps_rollup).
    pub pss_anon: u64,
    pub pss_file: u64,
    pub pss_shmem: u64,
    /// Resident anonymous memory mapped writable and executable: QEMU's
    /// TCG translation cache (none under KVM).
    pub code_cache: u64,
}

/// An idle container's PSS by kind, in KiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct Kinds {
    /// Guest RAM (the memfd QEMU and virtiofsd map).
    pub guest: u64,
    /// QEMU's TCG translation cache.
    pub code_cache: u64,
    /// Other private memory, per process name.
    pub qemu_anon: u64,
    pub virtiofsd_anon: u64,
    pub supervisor_anon: u64,
    /// Mapped files (binaries, libraries, the guest kernel QEMU keeps
    /// mapped): page cache shared by every VM on the host, so PSS splits it
    /// between them.
    pub files: u64,
}

/// All the processes of one idle container.
#[derive(Debug, Clone, Default)]
pub struct Footprint {
    pub procs: Vec<Proc>,
}

impl Footprint {
    pub fn rss(&self) -> u64 {
        self.procs.iter().map(|p| p.rss).sum()
    }
    pub fn pss(&self) -> u64 {
        self.procs.iter().map(|p| p.pss).sum()
    }
    /// The guest pages QEMU has touched (its RssShmem); `None` when no
    /// QEMU is among the processes.
    pub fn guest_touched(&self) -> Option<u64> {
        let qemu: Vec<&Proc> = self
            .procs
            .iter()
            .filter(|p| p.comm.starts_with("qemu-system"))
            .collect();
        (!qemu.is_empty()).then(|| qemu.iter().map(|p| p.rss_shmem).sum())
    }
    /// PSS by kind (see [`Kinds`]).
    pub fn kinds(&self) -> Kinds {
        let mut k = Kinds::default();
        for p in &self.procs {
            k.guest += p.pss_shmem;
            k.files += p.pss_file;
            let private = p.pss_anon.saturating_sub(p.code_cache);
            k.code_cache += p.code_cache.min(p.pss_anon);
            if p.comm.starts_with("qemu-system") {
                k.qemu_anon += private;
            } else if p.comm.starts_with("virtiofsd") {
                k.virtiofsd_anon += private;
            } else {
                k.supervisor_anon += private;
            }
        }
        k
    }

    /// RSS and PSS summed per process name, with the number of processes.
    pub fn by_comm(&self) -> BTreeMap<String, (usize, u64, u64)> {
        let mut m = BTreeMap::new();
        for p in &self.procs {
            let e = m.entry(p.comm.clone()).or_insert((0, 0, 0));
            e.0 += 1;
            e.1 += p.rss;
            e.2 += p.pss;
        }
        m
    }
}

/// `Key:   123 kB` lines of /proc files.
fn kib(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// Every process's parent, from /proc/PID/stat.
fn parents() -> Vec<(i32, i32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let ppid = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        Some((pid, ppid))
    })
    .collect()
}

/// `pid` and all its descendants.
fn tree(pid: i32) -> Vec<i32> {
    let all = parents();
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(all.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out
}

/// The memory of `pid` and everything below it.
pub fn measure(pid: i32) -> Result<Footprint, BenchError> {
    let mut procs = Vec::new();
    for p in tree(pid) {
        let path = PathBuf::from(format!("/proc/{p}/smaps_rollup"));
        let rollup = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            // Gone in between (a helper that exited): not part of the idle set.
            Err(_) if p != pid => continue,
            Err(source) => {
                return Err(BenchError::File {
                    what: "cannot read",
                    path,
                    source,
                })
            }
        };
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap_or_default();
        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        procs.push(Proc {
            comm: comm.trim().to_string(),
            rss: kib(&rollup, "Rss").unwrap_or(0),
            pss: kib(&rollup, "Pss").unwrap_or(0),
            rss_shmem: kib(&status, "RssShmem").unwrap_or(0),
            pss_anon: kib(&rollup, "Pss_Anon").unwrap_or(0),
            pss_file: kib(&rollup, "Pss_File").unwrap_or(0),
            pss_shmem: kib(&rollup, "Pss_Shmem").unwrap_or(0),
            code_cache: code_cache(p),
        });
    }
    Ok(Footprint { procs })
}

/// Resident KiB of `pid`'s anonymous mappings that are writable and
/// executable (/proc/PID/smaps): QEMU's TCG translation cache.
fn code_cache(pid: i32) -> u64 {
    let Ok(smaps) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return 0;
    };
    let mut total = 0;
    let mut inside = false;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: range, perms, offset, dev, inode[, path].
            let perms = fields.next().unwrap_or("");
            let inode = fields.nth(2).unwrap_or("");
            let path = fields.next();
            inside = perms.starts_with("rwx") && inode == "0" && path.is_none();
        } else if inside && first == "Rss:" {
            total += fields
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    total
}

/// `state ID` of `rt`: (status, pid).
fn state(rt: &Runtime, root: &Path, id: &str) -> Option<(String, i32)> {
    let out = rt
        .command(root)
        .args(["state", id])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let status = v["status"].as_str()?.to_string();
    let pid = i32::try_from(v["pid"].as_i64()?).ok()?;
    Some((status, pid))
}

/// Starts `n` containers of `rt` running `sleep 1000` from `bundle`, lets
/// them settle, measures each and deletes them all.
pub fn idle(
    ws: &Workspace,
    rt: &Runtime,
    bundle: &Path,
    n: usize,
) -> Result<Vec<Footprint>, BenchError> {
    let root = ws.root(rt);
    let ids: Vec<String> = (0..n)
        .map(|i| format!("avmb-idle-{}-{}-{i}", rt.docker_name, std::process::id()))
        .collect();
    let result = start_and_measure(ws, rt, &root, bundle, &ids);
    for id in &ids {
        let _ = rt
            .command(&root)
            .args(["delete", "--force", id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_file(ws.dir.join(format!("{id}.pid")));
    }
    reap_orphans();
    result
}

fn start_and_measure(
    ws: &Workspace,
    rt: &Runtime,
    root: &Path,
    bundle: &Path,
    ids: &[String],
) -> Result<Vec<Footprint>, BenchError> {
    let log_path = ws.dir.join(format!("{}-idle.log", rt.docker_name));
    let log = File::create(&log_path).map_err(|source| BenchError::File {
        what: "cannot create",
        path: log_path.clone(),
        source,
    })?;
    let log = (log, log_path);
    for id in ids {
        let pid_file = ws.dir.join(format!("{id}.pid"));
        let id = std::ffi::OsStr::new(id);
        invoke(
            rt,
            root,
            &[
                "create".as_ref(),
                "--bundle".as_ref(),
                bundle.as_os_str(),
                "--pid-file".as_ref(),
                pid_file.as_os_str(),
                id,
            ],
            &log,
        )?;
        invoke(rt, root, &["start".as_ref(), id], &log)?;
    }
    let mut pids = Vec::new();
    for id in ids {
        let running = crate::common::wait_for(RUNNING_TIMEOUT_SECS, || {
            state(rt, root, id).filter(|(s, _)| s == "running")
        });
        match running {
            Some((_, pid)) => pids.push(pid),
            None => {
                return Err(BenchError::NotRunning {
                    id: id.clone(),
                    secs: RUNNING_TIMEOUT_SECS,
                })
            }
        }
    }
    std::thread::sleep(SETTLE);
    pids.into_iter().map(measure).collect()
}
