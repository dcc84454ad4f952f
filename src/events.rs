//! `events` in runc's JSON: the event line `{"type":…,"id":…,"data":…}` and
//! the stats of runc 1.1 (`types/events.go`), field for field: the same
//! names and nesting, and Go's `omitempty` rules (a zero number, an empty
//! list or map is left out; a struct never is). Both tiers report through
//! [`Stats`]; `from_cgroup` turns libcgroups' figures into it.

use std::collections::BTreeMap;

use serde::Serialize;

/// One line of `events`. `data` is left out when there is none (`oom`).
#[derive(Debug, Serialize)]
pub struct Event<'a, T> {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<T>,
}

fn zero(n: &u64) -> bool {
    *n == 0
}

/// runc's `types.Stats`.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Stats {
    pub cpu: Cpu,
    pub cpuset: CpuSet,
    pub memory: Memory,
    pub pids: Pids,
    pub blkio: Blkio,
    pub hugetlb: BTreeMap<String, Hugetlb>,
    pub intel_rdt: IntelRdt,
    /// runc 1.1 reports none from a cgroup (`null`); a microVM of the
    /// builtin VMM reports its virtio NICs' counters here.
    pub network_interfaces: Option<Vec<serde_json::Value>>,
    /// agentvm's own, after runc's fields: what the builtin VMM counts for
    /// a microVM. Absent elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vmm: Option<Vmm>,
}

/// The builtin VMM's counters of a microVM (`protocol::VmmCounters`
/// without the NICs, which go to `network_interfaces`).
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Vmm {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_instruction_us: Option<u64>,
    pub vcpu_exits: u64,
    pub pio_exits: u64,
    pub mmio_exits: u64,
    pub bad_chains: u64,
    pub fs_requests: u64,
}

impl Stats {
    /// Adds what the VMM counts: its NICs as runc's `network_interfaces`,
    /// the rest as `vmm`.
    pub fn with_vmm(mut self, c: crate::protocol::VmmCounters) -> Stats {
        if !c.nics.is_empty() {
            self.network_interfaces = Some(
                c.nics
                    .iter()
                    .filter_map(|n| serde_json::to_value(n).ok())
                    .collect(),
            );
        }
        self.vmm = Some(Vmm {
            first_instruction_us: c.first_instruction_us,
            vcpu_exits: c.vcpu_exits,
            pio_exits: c.pio_exits,
            mmio_exits: c.mmio_exits,
            bad_chains: c.bad_chains,
            fs_requests: c.fs_requests,
        });
        self
    }
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Cpu {
    pub usage: CpuUsage,
    pub throttling: Throttling,
}

/// CPU time in nanoseconds.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct CpuUsage {
    #[serde(skip_serializing_if = "zero")]
    pub total: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub percpu: Vec<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub percpu_kernel: Vec<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub percpu_user: Vec<u64>,
    pub kernel: u64,
    pub user: u64,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Throttling {
    #[serde(skip_serializing_if = "zero")]
    pub periods: u64,
    #[serde(rename = "throttledPeriods", skip_serializing_if = "zero")]
    pub throttled_periods: u64,
    #[serde(rename = "throttledTime", skip_serializing_if = "zero")]
    pub throttled_time: u64,
}

/// runc's `types.CPUSet`: the cpuset cgroup's files.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct CpuSet {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cpus: Vec<u16>,
    pub cpu_exclusive: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mems: Vec<u16>,
    pub mem_hardwall: u64,
    pub mem_exclusive: u64,
    pub memory_migrate: u64,
    pub memory_spread_page: u64,
    pub memory_spread_slab: u64,
    pub memory_pressure: u64,
    pub sched_load_balance: u64,
    pub sched_relax_domain_level: i64,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct MemoryEntry {
    pub limit: u64,
    #[serde(skip_serializing_if = "zero")]
    pub usage: u64,
    #[serde(skip_serializing_if = "zero")]
    pub max: u64,
    pub failcnt: u64,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Memory {
    #[serde(skip_serializing_if = "zero")]
    pub cache: u64,
    pub usage: MemoryEntry,
    pub swap: MemoryEntry,
    pub kernel: MemoryEntry,
    #[serde(rename = "kernelTCP")]
    pub kernel_tcp: MemoryEntry,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub raw: BTreeMap<String, u64>,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Pids {
    #[serde(skip_serializing_if = "zero")]
    pub current: u64,
    #[serde(skip_serializing_if = "zero")]
    pub limit: u64,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct BlkioEntry {
    #[serde(skip_serializing_if = "zero")]
    pub major: u64,
    #[serde(skip_serializing_if = "zero")]
    pub minor: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub op: String,
    #[serde(skip_serializing_if = "zero")]
    pub value: u64,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Blkio {
    #[serde(
        rename = "ioServiceBytesRecursive",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub io_service_bytes_recursive: Vec<BlkioEntry>,
    #[serde(rename = "ioServicedRecursive", skip_serializing_if = "Vec::is_empty")]
    pub io_serviced_recursive: Vec<BlkioEntry>,
    #[serde(rename = "ioQueueRecursive", skip_serializing_if = "Vec::is_empty")]
    pub io_queued_recursive: Vec<BlkioEntry>,
    #[serde(
        rename = "ioServiceTimeRecursive",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub io_service_time_recursive: Vec<BlkioEntry>,
    #[serde(rename = "ioWaitTimeRecursive", skip_serializing_if = "Vec::is_empty")]
    pub io_wait_time_recursive: Vec<BlkioEntry>,
    #[serde(rename = "ioMergedRecursive", skip_serializing_if = "Vec::is_empty")]
    pub io_merged_recursive: Vec<BlkioEntry>,
    #[serde(rename = "ioTimeRecursive", skip_serializing_if = "Vec::is_empty")]
    pub io_time_recursive: Vec<BlkioEntry>,
    #[serde(rename = "sectorsRecursive", skip_serializing_if = "Vec::is_empty")]
    pub sectors_recursive: Vec<BlkioEntry>,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Hugetlb {
    #[serde(skip_serializing_if = "zero")]
    pub usage: u64,
    #[serde(skip_serializing_if = "zero")]
    pub max: u64,
    pub failcnt: u64,
}

/// Intel RDT: neither tier manages it, so it is empty (`{}`), as runc's on
/// a host without RDT.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct IntelRdt {}

fn memory_entry(m: &libcgroups::stats::MemoryData) -> MemoryEntry {
    MemoryEntry {
        limit: m.limit,
        usage: m.usage,
        max: m.max_usage,
        failcnt: m.fail_count,
    }
}

fn blkio_entries(v: &[libcgroups::stats::BlkioDeviceStat]) -> Vec<BlkioEntry> {
    v.iter()
        .map(|e| BlkioEntry {
            major: e.major,
            minor: e.minor,
            op: e.op_type.clone().unwrap_or_default(),
            value: e.value,
        })
        .collect()
}

impl Stats {
    /// runc's stats from libcgroups' (as runc's `convertLibcontainerStats`)
    /// and the cpuset cgroup's figures, which libcgroups does not read.
    pub fn from_cgroup(s: &libcgroups::stats::Stats, cpuset: CpuSet) -> Stats {
        let usage = &s.cpu.usage;
        let b = &s.blkio;
        Stats {
            cpu: Cpu {
                usage: CpuUsage {
                    total: usage.usage_total,
                    percpu: usage.per_core_usage_total.clone(),
                    percpu_kernel: usage.per_core_usage_kernel.clone(),
                    percpu_user: usage.per_core_usage_user.clone(),
                    kernel: usage.usage_kernel,
                    user: usage.usage_user,
                },
                throttling: Throttling {
                    periods: s.cpu.throttling.periods,
                    throttled_periods: s.cpu.throttling.throttled_periods,
                    throttled_time: s.cpu.throttling.throttled_time,
                },
            },
            cpuset,
            memory: Memory {
                cache: s.memory.cache,
                usage: memory_entry(&s.memory.memory),
                swap: memory_entry(&s.memory.memswap),
                kernel: memory_entry(&s.memory.kernel),
                kernel_tcp: memory_entry(&s.memory.kernel_tcp),
                raw: s
                    .memory
                    .stats
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect(),
            },
            pids: Pids {
                current: s.pids.current,
                limit: s.pids.limit,
            },
            blkio: Blkio {
                io_service_bytes_recursive: blkio_entries(&b.service_bytes),
                io_serviced_recursive: blkio_entries(&b.serviced),
                io_queued_recursive: blkio_entries(&b.queued),
                io_service_time_recursive: blkio_entries(&b.service_time),
                io_wait_time_recursive: blkio_entries(&b.wait_time),
                io_merged_recursive: blkio_entries(&b.merged),
                io_time_recursive: blkio_entries(&b.time),
                sectors_recursive: blkio_entries(&b.sectors),
            },
            hugetlb: s
                .hugetlb
                .iter()
                .map(|(k, h)| {
                    (
                        k.clone(),
                        Hugetlb {
                            usage: h.usage,
                            max: h.max_usage,
                            failcnt: h.fail_count,
                        },
                    )
                })
                .collect(),
            intel_rdt: IntelRdt {},
            network_interfaces: None,
            vmm: None,
        }
    }
}

/// A cpuset list as the kernel writes it (`0-3,8,10-11`); `None` when it
/// does not parse.
pub fn parse_cpu_list(s: &str) -> Option<Vec<u16>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u16, u16) = (a.parse().ok()?, b.parse().ok()?);
                if a > b {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// The cpuset figures of a cgroup directory: the v1 cpuset controller's
/// files, or on v2 the effective lists (the only ones v2 has).
pub fn read_cpuset(dir: &std::path::Path) -> CpuSet {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let num = |name: &str| read(name).and_then(|s| s.trim().parse::<u64>().ok());
    let list = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| read(n))
            .and_then(|s| parse_cpu_list(&s))
            .unwrap_or_default()
    };
    let v1 = |name: &str| num(&format!("cpuset.{name}")).unwrap_or(0);
    CpuSet {
        cpus: list(&["cpuset.cpus", "cpuset.cpus.effective"]),
        cpu_exclusive: v1("cpu_exclusive"),
        mems: list(&["cpuset.mems", "cpuset.mems.effective"]),
        mem_hardwall: v1("mem_hardwall"),
        mem_exclusive: v1("mem_exclusive"),
        memory_migrate: v1("memory_migrate"),
        memory_spread_page: v1("memory_spread_page"),
        memory_spread_slab: v1("memory_spread_slab"),
        memory_pressure: v1("memory_pressure"),
        sched_load_balance: v1("sched_load_balance"),
        sched_relax_domain_level: read("cpuset.sched_relax_domain_level")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0),
    }
}

/// The `oom_kill` count of a cgroup's `memory.events` (v2) or
/// `memory.oom_control` (v1) text.
pub fn oom_kill_count(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == "oom_kill").then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_of_runc_1_1() {
        let mut cg = libcgroups::stats::Stats::default();
        cg.cpu.usage.usage_total = 10;
        cg.cpu.usage.per_core_usage_total = vec![6, 4];
        cg.memory.memory.limit = 100;
        cg.memory.memory.usage = 7;
        cg.memory.stats.insert("rss".into(), 3);
        cg.pids.current = 1;
        cg.hugetlb.insert("2MB".into(), Default::default());
        let s = Stats::from_cgroup(
            &cg,
            CpuSet {
                cpus: vec![0, 1],
                sched_relax_domain_level: -1,
                ..Default::default()
            },
        );
        let v = serde_json::to_value(&s).expect("json");
        let expected = serde_json::json!({
            "cpu": {"usage": {"total": 10, "percpu": [6, 4], "kernel": 0, "user": 0},
                    "throttling": {}},
            "cpuset": {"cpus": [0, 1], "cpu_exclusive": 0, "mem_hardwall": 0,
                       "mem_exclusive": 0, "memory_migrate": 0, "memory_spread_page": 0,
                       "memory_spread_slab": 0, "memory_pressure": 0,
                       "sched_load_balance": 0, "sched_relax_domain_level": -1},
            "memory": {"usage": {"limit": 100, "usage": 7, "failcnt": 0},
                       "swap": {"limit": 0, "failcnt": 0},
                       "kernel": {"limit": 0, "failcnt": 0},
                       "kernelTCP": {"limit": 0, "failcnt": 0},
                       "raw": {"rss": 3}},
            "pids": {"current": 1},
            "blkio": {},
            "hugetlb": {"2MB": {"failcnt": 0}},
            "intel_rdt": {},
            "network_interfaces": null
        });
        assert_eq!(v, expected);
        let oom = Event::<Stats> {
            kind: "oom",
            id: "c",
            data: None,
        };
        assert_eq!(
            serde_json::to_string(&oom).expect("json"),
            r#"{"type":"oom","id":"c"}"#
        );
    }

    #[test]
    fn vmm_counters_fill_runc_s_network_interfaces() {
        let plain = serde_json::to_value(Stats::default()).expect("json");
        assert!(plain["network_interfaces"].is_null());
        assert!(plain.get("vmm").is_none());
        let counters = crate::protocol::VmmCounters {
            first_instruction_us: Some(1500),
            vcpu_exits: 10,
            mmio_exits: 4,
            nics: vec![crate::protocol::NicCounters {
                name: "eth0".into(),
                rx_bytes: 84,
                rx_packets: 1,
                tx_dropped: 2,
                ..Default::default()
            }],
            ..Default::default()
        };
        let v = serde_json::to_value(Stats::default().with_vmm(counters)).expect("json");
        // runc's NetworkInterface fields, all of them.
        let nic = &v["network_interfaces"][0];
        let mut keys: Vec<&str> = nic
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "name",
                "rx_bytes",
                "rx_dropped",
                "rx_errors",
                "rx_packets",
                "tx_bytes",
                "tx_dropped",
                "tx_errors",
                "tx_packets"
            ]
        );
        assert_eq!(
            (nic["name"].as_str(), nic["rx_bytes"].as_u64()),
            (Some("eth0"), Some(84))
        );
        assert_eq!(v["vmm"]["first_instruction_us"], 1500);
        assert_eq!(v["vmm"]["vcpu_exits"], 10);
    }

    #[test]
    fn cpu_lists_and_oom_counts() {
        assert_eq!(parse_cpu_list("0-2,5\n"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(oom_kill_count(v1), Some(2));
        let v2 = "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kill_count(v2), Some(1));
        assert_eq!(oom_kill_count("oom 3\n"), None);
    }
}
