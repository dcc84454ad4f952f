//! Part (e): Kubernetes pods through containerd's CRI, on the tests' CRI
//! containerd (`tests/support/src/cri.rs`: CNI bridge, handlers `runc` and
//! `agentvm`). Pod start is RunPodSandbox plus one container created and
//! started (`sleep 1000`), as the kubelet does for a one-container pod;
//! teardown is StopPodSandbox plus RemovePodSandbox. Each with runc's shim,
//! agentvm's container tier and agentvm's microvm tier (a pod is one VM).
//!
//! Host memory of the microvm tier: a pod with 1 and with 4 containers
//! against 4 pods of one container each (4 microVMs): the PSS of each pod's
//! shim and every process below it (the supervisor, QEMU, virtiofsd, the
//! members' relays), summed as part (c) sums a container's.

use std::time::{Duration, Instant};

use crate::common::cri::{cri, Cri, Pod, PodSpec, HANDLER_AGENTVM, HANDLER_RUNC};
use crate::common::ISOLATION_ANNOTATION;
use crate::error::BenchError;
use crate::memory::{measure, SETTLE};
use crate::stats::{mib, ms, ratio_table, Row, Series};
use crate::{failure_notes, interleave, Entry, Options, Schedule};

/// One way of running pods.
pub struct PodRuntime {
    name: &'static str,
    handler: &'static str,
    tier: Option<&'static str>,
    slow: bool,
}

impl Entry for PodRuntime {
    fn name(&self) -> &'static str {
        self.name
    }
    fn slow(&self) -> bool {
        self.slow
    }
}

const RUNC: PodRuntime = PodRuntime {
    name: crate::runtimes::REFERENCE,
    handler: HANDLER_RUNC,
    tier: None,
    slow: false,
};
const CONTAINER: PodRuntime = PodRuntime {
    name: "agentvm container",
    handler: HANDLER_AGENTVM,
    tier: Some("container"),
    slow: false,
};
const MICROVM: PodRuntime = PodRuntime {
    name: crate::runtimes::MICROVM,
    handler: HANDLER_AGENTVM,
    tier: Some("microvm"),
    slow: true,
};

/// One round's times.
#[derive(Debug, Clone, Copy)]
pub struct Times {
    start: Duration,
    teardown: Duration,
}

fn cri_err(e: String) -> BenchError {
    BenchError::Cri(e)
}

fn run_pod(c: &Cri, rt: &PodRuntime, name: &str) -> Result<Pod, BenchError> {
    let annotations: Vec<(&str, &str)> = rt
        .tier
        .map(|t| vec![(ISOLATION_ANNOTATION, t)])
        .unwrap_or_default();
    c.run_pod(&PodSpec {
        name,
        handler: rt.handler,
        annotations: &annotations,
    })
    .map_err(cri_err)
}

/// One pod started (sandbox + one container) and torn down.
fn round(c: &Cri, rt: &PodRuntime, name: &str) -> Result<Times, BenchError> {
    let t0 = Instant::now();
    let pod = run_pod(c, rt, name)?;
    let started = c.start_container(&pod, "main", &["sleep", "1000"], &[]);
    let t1 = Instant::now();
    let torn = c.remove_pod(&pod);
    let t2 = Instant::now();
    started.map_err(cri_err)?;
    torn.map_err(cri_err)?;
    Ok(Times {
        start: t1 - t0,
        teardown: t2 - t1,
    })
}

/// The pid of the shim (the binary `binary`) serving `pod`: started with
/// `-id <pod id>`.
fn shim_of(pod: &Pod, binary: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_shim = args.first().is_some_and(|a| a.ends_with(binary.as_bytes()));
        let id = args
            .iter()
            .position(|a| *a == b"-id")
            .and_then(|i| args.get(i + 1));
        (is_shim && id.is_some_and(|id| *id == pod.id.as_bytes())).then_some(pid)
    })
}

/// A memory row: how many pods of how many containers, the processes and
/// PSS (KiB) summed over all of them.
struct PodMemory {
    what: String,
    processes: usize,
    pss: u64,
    guest: u64,
}

/// Starts `pods` pods of `containers` containers each with `rt`, waits for
/// them to settle, sums the PSS of their shims' trees, and removes them.
fn pods_memory(
    c: &Cri,
    rt: &PodRuntime,
    tag: &str,
    pods: usize,
    containers: usize,
) -> Result<PodMemory, BenchError> {
    let mut started = Vec::new();
    let outcome = (|| {
        for p in 0..pods {
            let name = format!("avmb-podmem-{tag}-{}-{p}", std::process::id());
            let pod = run_pod(c, rt, &name)?;
            started.push(pod);
            let pod = started.last().ok_or(BenchError::Cri("no pod".into()))?;
            for k in 0..containers {
                c.start_container(pod, &format!("c{k}"), &["sleep", "1000"], &[])
                    .map_err(cri_err)?;
            }
        }
        std::thread::sleep(SETTLE);
        let mut m = PodMemory {
            what: format!(
                "{}: {pods} pod{} of {containers} container{}",
                rt.name,
                if pods == 1 { "" } else { "s" },
                if containers == 1 { "" } else { "s" }
            ),
            processes: 0,
            pss: 0,
            guest: 0,
        };
        for pod in &started {
            let binary = if rt.handler == HANDLER_RUNC {
                "containerd-shim-runc-v2"
            } else {
                "containerd-shim-agentvm-v2"
            };
            let shim = shim_of(pod, binary)
                .ok_or_else(|| BenchError::Cri(format!("no {binary} for pod {}", pod.id)))?;
            let fp = measure(shim)?;
            m.processes += fp.procs.len();
            m.pss += fp.pss();
            m.guest += fp.guest_touched().unwrap_or(0);
        }
        Ok(m)
    })();
    for pod in &started {
        if let Err(e) = c.remove_pod(pod) {
            eprintln!("pod: cannot remove pod {}: {e}", pod.id);
        }
    }
    outcome
}

/// Part (e). Returns the report section and whether every round passed.
pub fn part(opts: &Options) -> (String, bool) {
    const TITLE: &str = "## (e) Kubernetes pods through containerd's CRI";
    let c = match cri() {
        Ok(c) => c,
        Err(why) => {
            println!("skipped: pod part: {why}");
            return (format!("{TITLE}\n\nskipped: {why}\n"), true);
        }
    };
    let shim = crate::common::shim_bin();
    if !shim.is_file() {
        let why = format!(
            "the shim {} is not built (make build builds it)",
            shim.display()
        );
        println!("skipped: pod part: {why}");
        return (format!("{TITLE}\n\nskipped: {why}\n"), true);
    }
    let mut entries = vec![RUNC, CONTAINER];
    let mut notes = String::new();
    let microvm = match crate::common::guest::unavailable() {
        None => true,
        Some(why) => {
            println!("skipped: pod part, {}: {why}", MICROVM.name);
            notes.push_str(&format!("\nskipped {}: {why}\n", MICROVM.name));
            false
        }
    };
    if microvm {
        entries.push(MICROVM);
    }
    let schedule = Schedule::new(opts.pod_rounds, opts.microvm_pod_rounds, opts.warmup.min(1));
    let pid = std::process::id();
    let series: Vec<Series<Times>> = interleave(&entries, schedule, "pod", |rt, r| {
        round(c, rt, &format!("avmb-pod-{}-{pid}-{r}", rt.handler))
    });
    let start: Vec<Row> = series
        .iter()
        .map(|s| Row::from_series(s, |t| t.start))
        .collect();
    let teardown: Vec<Row> = series
        .iter()
        .map(|s| Row::from_series(s, |t| t.teardown))
        .collect();
    let mut ok = series.iter().all(|s| s.failures.is_empty());
    let mut section = format!(
        "{TITLE}\n\n{}, on the tests' CRI containerd (CNI bridge; handlers `runc`, and `agentvm` \
         with the pod annotation `io.agentvm.isolation`). Pod start: RunPodSandbox, then one \
         container (`sleep 1000`) created and started, wall clock of the CRI calls:\n\n{}\n\
         Pod teardown: StopPodSandbox + RemovePodSandbox of that pod:\n\n{}{}",
        schedule.describe(&entries),
        ratio_table(&start),
        ratio_table(&teardown),
        notes
    );
    let total = |rows: &[Row], name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .and_then(|r| r.summary)
            .map(|s| s.median)
    };
    if let (Some(s), Some(t)) = (total(&start, MICROVM.name), total(&teardown, MICROVM.name)) {
        section.push_str(&format!(
            "\nA microvm-tier pod's whole life here: {} (start {} + teardown {}).\n",
            ms(s + t),
            ms(s),
            ms(t)
        ));
    }
    let mut runs: Vec<(&PodRuntime, &str, usize, usize)> =
        vec![(&RUNC, "one", 1, 1), (&CONTAINER, "one", 1, 1)];
    if microvm {
        runs.extend([
            (&MICROVM, "one", 1, 1),
            (&MICROVM, "four", 1, 4),
            (&MICROVM, "apart", 4, 1),
        ]);
    }
    let mut rows: Vec<PodMemory> = Vec::new();
    for (rt, tag, pods, containers) in runs {
        eprintln!(
            "pod: memory, {}: {pods} pod(s) of {containers} container(s)",
            rt.name
        );
        match pods_memory(c, rt, tag, pods, containers) {
            Ok(m) => rows.push(m),
            Err(e) => {
                eprintln!("pod: memory {} {tag} failed: {e}", rt.name);
                section.push_str(&format!(
                    "\nmemory, {}: {pods} pod(s) of {containers} container(s) failed:\n\n```\n{}\n```\n",
                    rt.name,
                    e.to_string().trim()
                ));
                ok = false;
            }
        }
    }
    let pss_of = |prefix: &str| {
        rows.iter()
            .find(|r| r.what.starts_with(prefix))
            .map(|r| r.pss)
    };
    let runc_pod = pss_of(&format!("{}: 1 pod of 1 ", RUNC.name));
    let vm_pod = pss_of(&format!("{}: 1 pod of 1 ", MICROVM.name));
    let times = |v: u64, base: Option<u64>| match base {
        Some(b) if b > 0 => format!("{:.2}×", v as f64 / b as f64),
        _ => "–".into(),
    };
    let mut table = String::from(
        "| pods | processes | PSS | guest RAM touched | PSS ÷ runc's pod | PSS ÷ one microvm pod of 1 |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        let vm = r.what.starts_with(MICROVM.name);
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.what,
            r.processes,
            mib(r.pss),
            if vm { mib(r.guest) } else { "–".into() },
            times(r.pss, runc_pod),
            if vm {
                times(r.pss, vm_pod)
            } else {
                "–".into()
            },
        ));
    }
    section.push_str(&format!(
        "\nHost memory of pods (`sleep 1000` in each container), measured {} s after the last \
         container started: PSS summed over each pod's shim and every process below it (the \
         pause and container processes; for agentvm also the OOM watches, and in the microvm \
         tier the supervisor, QEMU, virtiofsd and the members' relays), as part (c) sums a \
         container's; guest RAM touched is QEMU's `RssShmem`. A microvm pod of 4 containers is \
         one VM; 4 pods of 1 are 4 VMs:\n\n{table}",
        SETTLE.as_secs()
    ));
    section.push_str(&failure_notes(&series));
    (section, ok)
}
