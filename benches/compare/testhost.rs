//! Part (f): the builtin VMM beside QEMU, both on a standard hardware-style
//! KVM, in one run. Our machines' `/dev/kvm` is `kvm_pvm`, on which the
//! builtin VMM cannot boot Linux, so this part runs inside the test host
//! of `make test-builtin` (a QEMU TCG VM whose vCPU emulates AMD SVM:
//! `tests/testhost/run.sh --bench`): nested KVM on TCG, so its figures are
//! correctness-grade, comparable with each other, not with hardware.
//!
//! Inside the test host this same benchmark binary runs as
//! `compare testhost-inside`: the OCI lifecycle of `/bin/true` with
//! `vmm = "builtin"` and `vmm = "qemu"` interleaved, each round's boot trace
//! and the builtin VMM's own time from the VM's creation to the guest's
//! first instruction, then one idle `sleep` container per VMM measured as in
//! part (c). It prints one line, [`MARK`] and a JSON [`Inside`], which the
//! host side reads off the test host's console.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::common;
use crate::oci::{self, Workspace};
use crate::runtimes::Runtime;
use crate::stats::{mib, ms, summarize};

/// The console line that carries the results.
pub const MARK: &str = "agentvm-bench-testhost:";
/// The two entries, in column order.
const VMMS: [&str; 2] = ["builtin", "qemu"];

/// What the run inside the test host measured.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Inside {
    pub rounds: usize,
    pub kernel: String,
    pub entries: Vec<EntryResult>,
}

/// One VMM's figures.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct EntryResult {
    pub vmm: String,
    pub rounds: Vec<RoundResult>,
    pub failures: Vec<String>,
    pub idle: Option<Idle>,
    pub idle_error: Option<String>,
}

/// One timed round, in microseconds.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RoundResult {
    pub total_us: u64,
    pub create_us: u64,
    pub start_us: u64,
    pub wait_us: u64,
    pub delete_us: u64,
    pub boot: Vec<(String, u64)>,
    pub first_instruction_us: Option<u64>,
    #[serde(default)]
    pub first_instruction_steps: Vec<(String, u64)>,
}

/// An idle container's host memory, in KiB, summed over its processes.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Idle {
    pub rss: u64,
    pub pss: u64,
    /// Guest pages touched (the memfd's resident pages).
    pub rss_shmem: u64,
    pub pss_shmem: u64,
    /// Per process name: (name, RSS, RssShmem).
    pub procs: Vec<(String, u64, u64)>,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The runtime entry of agentvm's microvm tier with `vmm`.
fn runtime(dir: &Path, vmm: &'static str) -> Result<Runtime, String> {
    let kernel = common::guest::kernel()?;
    let config = dir.join(format!("agentvm-{vmm}.toml"));
    let text = format!(
        "[microvm]\nkernel = {:?}\nvirtiofsd = {:?}\nvmm = {vmm:?}\n",
        kernel.display().to_string(),
        common::guest::VIRTIOFSD
    );
    std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&config, text))
        .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    Ok(Runtime {
        name: vmm,
        program: common::agentvm_bin(),
        global_args: vec![
            "--isolation=microvm".into(),
            "--config".into(),
            config.display().to_string(),
        ],
        docker_name: vmm,
        slow: false,
    })
}

/// Inside the test host: measures and prints the [`MARK`] line.
pub fn inside(rounds: usize, warmup: usize) -> anyhow::Result<()> {
    let dir = Path::new(crate::BENCH_DIR);
    std::fs::create_dir_all(dir)?;
    let runtimes = VMMS
        .iter()
        .map(|v| runtime(dir, v))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let ws = Workspace::prepare(dir, &runtimes[0])?;
    for rt in &runtimes {
        ws.clear_root(rt)?;
    }
    crate::reaper::set_subreaper(true)?;
    let pid = std::process::id();
    let mut results: Vec<EntryResult> = VMMS
        .iter()
        .map(|v| EntryResult {
            vmm: v.to_string(),
            ..Default::default()
        })
        .collect();
    for round in 0..warmup + rounds {
        for k in 0..runtimes.len() {
            // The order rotates from round to round, as in part (a).
            let i = (round + k) % runtimes.len();
            let rt = &runtimes[i];
            let id = format!("avmb-th-{}-{pid}-{round}", rt.docker_name);
            match oci::round(&ws, rt, &id) {
                Ok(p) if round >= warmup => results[i].rounds.push(RoundResult {
                    total_us: micros(p.total),
                    create_us: micros(p.create),
                    start_us: micros(p.start),
                    wait_us: micros(p.wait),
                    delete_us: micros(p.delete),
                    boot: p
                        .boot
                        .iter()
                        .map(|(n, d)| (n.clone(), micros(*d)))
                        .collect(),
                    first_instruction_us: p.first_instruction.map(micros),
                    first_instruction_steps: p
                        .first_instruction_steps
                        .iter()
                        .map(|(n, d)| (n.clone(), micros(*d)))
                        .collect(),
                }),
                Ok(_) => {}
                Err(e) => {
                    eprintln!("testhost: {} round {round} failed: {e}", rt.name);
                    results[i].failures.push(e.to_string());
                }
            }
        }
        eprintln!("testhost: {}/{} rounds", round + 1, warmup + rounds);
    }
    let sleeper = ws.bundle_running("bundle-idle", &["sleep", "1000"])?;
    for (i, rt) in runtimes.iter().enumerate() {
        match crate::memory::idle(&ws, rt, &sleeper, 1) {
            Ok(fps) => {
                let fp = &fps[0];
                results[i].idle = Some(Idle {
                    rss: fp.rss(),
                    pss: fp.pss(),
                    rss_shmem: fp.procs.iter().map(|p| p.rss_shmem).sum(),
                    pss_shmem: fp.procs.iter().map(|p| p.pss_shmem).sum(),
                    procs: fp
                        .procs
                        .iter()
                        .map(|p| (p.comm.clone(), p.rss, p.rss_shmem))
                        .collect(),
                });
            }
            Err(e) => results[i].idle_error = Some(e.to_string()),
        }
    }
    crate::reaper::set_subreaper(false)?;
    crate::reaper::reap_orphans();
    let inside = Inside {
        rounds,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        entries: results,
    };
    println!("{MARK} {}", serde_json::to_string(&inside)?);
    Ok(())
}

/// The test host's kernel, as `make kernel-testhost` caches it (building
/// it if it is not cached yet).
fn testhost_kernel() -> Result<PathBuf, String> {
    if let Some(k) = std::env::var_os("TESTHOST_KERNEL") {
        return Ok(PathBuf::from(k));
    }
    let out = Command::new(common::repo_root().join("kernels/build.sh"))
        .args(["--flavor", "testhost"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("kernels/build.sh --flavor testhost: {e}"))?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || path.is_empty() {
        return Err(format!(
            "kernels/build.sh --flavor testhost failed ({})",
            out.status
        ));
    }
    Ok(PathBuf::from(path))
}

/// On the host: boots the test host with this binary and agentvm, and
/// reads what the run inside measured. `Err` says why the part cannot run
/// (a `skipped:` note) or what failed.
pub fn part(rounds: usize) -> Result<(String, bool), PartError> {
    let exe = std::env::current_exe().map_err(|e| PartError::Skipped(e.to_string()))?;
    let agentvm = common::agentvm_bin();
    let guest = common::guest::kernel().map_err(PartError::Skipped)?;
    let host = testhost_kernel().map_err(PartError::Skipped)?;
    let script = common::repo_root().join("tests/testhost/run.sh");
    eprintln!("testhost: booting the test host (rounds {rounds}); its console follows");
    let out = Command::new(&script)
        .arg("--bench")
        .arg(&exe)
        .arg(&agentvm)
        .env("AGENTVM_KERNEL", &guest)
        .env("TESTHOST_KERNEL", &host)
        .env("AGENTVM_BENCH_TESTHOST_ROUNDS", rounds.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| PartError::Failed(format!("{}: {e}", script.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.code() == Some(77) {
        let why = text
            .lines()
            .find_map(|l| l.strip_prefix("skipped: "))
            .unwrap_or("the test host cannot run here");
        return Err(PartError::Skipped(why.to_string()));
    }
    let line = text.lines().find_map(|l| {
        let at = l.find(MARK)?;
        Some(l[at + MARK.len()..].trim().to_string())
    });
    let Some(line) = line else {
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(PartError::Failed(format!(
            "the test host reported no results ({}); its console ended:\n{}",
            out.status,
            tail.join("\n")
        )));
    };
    let inside: Inside = serde_json::from_str(&line)
        .map_err(|e| PartError::Failed(format!("bad results from the test host: {e}")))?;
    let ok = inside.entries.iter().all(|e| {
        e.failures.is_empty() && e.idle_error.is_none() && e.rounds.len() == inside.rounds
    });
    Ok((render(&inside), ok))
}

/// Why part (f) gave no figures.
#[derive(Debug)]
pub enum PartError {
    Skipped(String),
    Failed(String),
}

fn median_of(rounds: &[RoundResult], f: impl Fn(&RoundResult) -> Option<u64>) -> Option<Duration> {
    summarize(rounds.iter().filter_map(&f).map(Duration::from_micros)).map(|s| s.median)
}

fn cell(d: Option<Duration>) -> String {
    d.map_or_else(|| "–".to_string(), ms)
}

/// The report section.
pub fn render(inside: &Inside) -> String {
    let mut out = format!(
        "## (f) The builtin VMM beside QEMU, both on KVM, inside the test host\n\n\
         Inside the test host of `make test-builtin` (QEMU TCG, `-cpu max` emulating AMD SVM, \
         test host kernel {}): **nested KVM on TCG, so these are correctness-grade figures**, \
         comparable between the two columns of this run, not with hardware. {} rounds per VMM, \
         interleaved, after 1 untimed warm-up round; medians of the OCI lifecycle of `/bin/true` \
         and of its boot trace.\n\n| | {} |\n|---|{}\n",
        inside.kernel,
        inside.rounds,
        inside
            .entries
            .iter()
            .map(|e| format!("vmm = {}", e.vmm))
            .collect::<Vec<_>>()
            .join(" | "),
        "---:|".repeat(inside.entries.len()),
    );
    let mut row = |label: &str, f: &dyn Fn(&EntryResult) -> String| {
        out.push_str(&format!(
            "| {label} | {} |\n",
            inside.entries.iter().map(f).collect::<Vec<_>>().join(" | ")
        ));
    };
    row(
        "VM creation → first guest instruction (the VMM's own count)",
        &|e| cell(median_of(&e.rounds, |r| r.first_instruction_us)),
    );
    // The VMM's steps to the first instruction, where it counts them.
    let steps: Vec<String> = inside
        .entries
        .iter()
        .find_map(|e| {
            e.rounds
                .iter()
                .find(|r| !r.first_instruction_steps.is_empty())
        })
        .map(|r| {
            r.first_instruction_steps
                .iter()
                .map(|(n, _)| n.clone())
                .collect()
        })
        .unwrap_or_default();
    for name in &steps {
        row(&format!("… of which: {name}"), &|e| {
            cell(median_of(&e.rounds, |r| {
                r.first_instruction_steps
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, us)| *us)
            }))
        });
    }
    // The parts of the boot trace, in the first round's order.
    let names: Vec<String> = inside
        .entries
        .iter()
        .find_map(|e| e.rounds.first())
        .map(|r| r.boot.iter().map(|(n, _)| n.clone()).collect())
        .unwrap_or_default();
    for name in &names {
        row(&format!("create: {name}"), &|e| {
            cell(median_of(&e.rounds, |r| {
                r.boot.iter().find(|(n, _)| n == name).map(|(_, us)| *us)
            }))
        });
    }
    let boot_to_agent = ["vmm launch", "vmm start", "kernel", "agent"];
    row(
        "boot to the guest agent (vmm launch + vmm start + kernel + agent)",
        &|e| {
            cell(median_of(&e.rounds, |r| {
                let parts: Vec<u64> = r
                    .boot
                    .iter()
                    .filter(|(n, _)| boot_to_agent.contains(&n.as_str()))
                    .map(|(_, us)| *us)
                    .collect();
                (parts.len() == boot_to_agent.len()).then(|| parts.iter().sum())
            }))
        },
    );
    row("`create`", &|e| {
        cell(median_of(&e.rounds, |r| Some(r.create_us)))
    });
    row("`start`", &|e| {
        cell(median_of(&e.rounds, |r| Some(r.start_us)))
    });
    row("wait for exit (VM shutdown included)", &|e| {
        cell(median_of(&e.rounds, |r| Some(r.wait_us)))
    });
    row("`delete`", &|e| {
        cell(median_of(&e.rounds, |r| Some(r.delete_us)))
    });
    row("**run `true`: the whole round**", &|e| {
        cell(median_of(&e.rounds, |r| Some(r.total_us)))
    });
    let idle = |f: fn(&Idle) -> u64| {
        move |e: &EntryResult| e.idle.as_ref().map_or("–".into(), |i| mib(f(i)))
    };
    row(
        "idle `sleep`: host RSS of all its processes",
        &idle(|i| i.rss),
    );
    row(
        "idle: shared memory resident (`RssShmem` of each process: the guest pages, once per \
         process that maps them)",
        &idle(|i| i.rss_shmem),
    );
    row(
        "idle: **host memory beyond the guest pages** (RSS − RssShmem)",
        &idle(|i| i.rss.saturating_sub(i.rss_shmem)),
    );
    row(
        "idle: PSS beyond the guest pages",
        &idle(|i| i.pss.saturating_sub(i.pss_shmem)),
    );
    out.push_str(
        "\nUnder the builtin VMM the supervisor is the VMM (vCPUs, devices and virtio-fs are its \
         threads): its RSS beyond the guest pages is the VMM's whole footprint. Under QEMU the \
         row sums the supervisor, QEMU and virtiofsd.\n",
    );
    for e in &inside.entries {
        if let Some(i) = &e.idle {
            let procs: Vec<String> = i
                .procs
                .iter()
                .map(|(c, rss, shm)| format!("`{c}` {} (guest {})", mib(*rss), mib(*shm)))
                .collect();
            out.push_str(&format!(
                "\nvmm = {}, idle, RSS per process: {}.\n",
                e.vmm,
                procs.join("; ")
            ));
        }
        if let Some(err) = &e.idle_error {
            out.push_str(&format!(
                "\nvmm = {}: the idle container failed: {err}\n",
                e.vmm
            ));
        }
        out.push_str(&crate::failure_note(
            &format!("vmm = {}", e.vmm),
            &e.failures,
        ));
    }
    out
}
