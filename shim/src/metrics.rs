//! `Stats`: a container's figures in containerd's cgroup metrics types,
//! read from `agentvm events --stats` (runc's stats JSON), which both
//! tiers answer: the container tier from the container's cgroup on the
//! host, the microvm tier from the container's cgroup in the guest.
//!
//! As runc's shim, the type follows the host's cgroup layout, which is
//! what containerd's callers (CRI, `ctr task metrics`) expect of it:
//! `io.containerd.cgroups.v1.Metrics` on a v1 or hybrid host (the
//! protos crate's generated type), `io.containerd.cgroups.v2.Metrics` on
//! a unified (v2) host. The protos crate has no v2 type, so that message
//! is encoded here, field numbers as in containerd's `cgroup2/stats`
//! schema; only the fields runc's stats can fill are written.

use std::collections::BTreeMap;

use containerd_shim::protos::cgroups::metrics as v1;
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::{Message, MessageField};
use serde::Deserialize;

/// The type URL containerd's typeurl registry knows the v1 metrics by.
pub const V1_TYPE_URL: &str = "io.containerd.cgroups.v1.Metrics";
/// The type URL of the v2 metrics.
pub const V2_TYPE_URL: &str = "io.containerd.cgroups.v2.Metrics";

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("agentvm events --stats printed no stats line: {0}")]
    NoStats(String),
    #[error("cannot encode the v1 metrics: {0}")]
    Encode(String),
}

/// Which metrics type the host's cgroup layout calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    V1,
    V2,
}

impl CgroupMode {
    /// v2 when `/sys/fs/cgroup` itself is a cgroup2 mount (a unified
    /// host), else v1 (v1 or hybrid).
    pub fn of_host() -> CgroupMode {
        match nix::sys::statfs::statfs("/sys/fs/cgroup") {
            Ok(fs) if fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC => {
                CgroupMode::V2
            }
            _ => CgroupMode::V1,
        }
    }
}

/// One `{"type":"stats","data":{...}}` line (agentvm's `events.rs`: runc
/// 1.1's field names; absent numbers are zero).
#[derive(Debug, Default, Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    data: Option<Stats>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Stats {
    cpu: Cpu,
    memory: Memory,
    pids: Pids,
    blkio: Blkio,
    hugetlb: BTreeMap<String, Hugetlb>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Cpu {
    usage: CpuUsage,
    throttling: Throttling,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CpuUsage {
    total: u64,
    percpu: Vec<u64>,
    kernel: u64,
    user: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Throttling {
    periods: u64,
    #[serde(rename = "throttledPeriods")]
    throttled_periods: u64,
    #[serde(rename = "throttledTime")]
    throttled_time: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MemoryEntry {
    limit: u64,
    usage: u64,
    max: u64,
    failcnt: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Memory {
    cache: u64,
    usage: MemoryEntry,
    swap: MemoryEntry,
    kernel: MemoryEntry,
    #[serde(rename = "kernelTCP")]
    kernel_tcp: MemoryEntry,
    /// The cgroup's `memory.stat`, by its own names.
    raw: BTreeMap<String, u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Pids {
    current: u64,
    limit: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct BlkioEntry {
    major: u64,
    minor: u64,
    op: String,
    value: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Blkio {
    #[serde(rename = "ioServiceBytesRecursive")]
    io_service_bytes_recursive: Vec<BlkioEntry>,
    #[serde(rename = "ioServicedRecursive")]
    io_serviced_recursive: Vec<BlkioEntry>,
    #[serde(rename = "ioQueueRecursive")]
    io_queued_recursive: Vec<BlkioEntry>,
    #[serde(rename = "ioServiceTimeRecursive")]
    io_service_time_recursive: Vec<BlkioEntry>,
    #[serde(rename = "ioWaitTimeRecursive")]
    io_wait_time_recursive: Vec<BlkioEntry>,
    #[serde(rename = "ioMergedRecursive")]
    io_merged_recursive: Vec<BlkioEntry>,
    #[serde(rename = "ioTimeRecursive")]
    io_time_recursive: Vec<BlkioEntry>,
    #[serde(rename = "sectorsRecursive")]
    sectors_recursive: Vec<BlkioEntry>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Hugetlb {
    usage: u64,
    max: u64,
    failcnt: u64,
}

/// The metrics of `agentvm events --stats` output, packed in an `Any` of
/// the type `mode` calls for.
pub fn from_events_output(output: &[u8], mode: CgroupMode) -> Result<Any, MetricsError> {
    let text = String::from_utf8_lossy(output);
    let stats = text
        .lines()
        .filter_map(|line| serde_json::from_str::<Event>(line).ok())
        .find(|e| e.kind == "stats")
        .and_then(|e| e.data)
        .ok_or_else(|| MetricsError::NoStats(text.trim().chars().take(200).collect()))?;
    match mode {
        CgroupMode::V1 => {
            let value = v1_metrics(&stats)
                .write_to_bytes()
                .map_err(|e| MetricsError::Encode(e.to_string()))?;
            Ok(Any {
                type_url: V1_TYPE_URL.to_string(),
                value,
                ..Default::default()
            })
        }
        CgroupMode::V2 => Ok(Any {
            type_url: V2_TYPE_URL.to_string(),
            value: v2_metrics(&stats),
            ..Default::default()
        }),
    }
}

fn v1_entry(e: &MemoryEntry) -> MessageField<v1::MemoryEntry> {
    MessageField::some(v1::MemoryEntry {
        limit: e.limit,
        usage: e.usage,
        max: e.max,
        failcnt: e.failcnt,
        ..Default::default()
    })
}

fn v1_blkio(entries: &[BlkioEntry]) -> Vec<v1::BlkIOEntry> {
    entries
        .iter()
        .map(|e| v1::BlkIOEntry {
            op: e.op.clone(),
            major: e.major,
            minor: e.minor,
            value: e.value,
            ..Default::default()
        })
        .collect()
}

/// containerd's v1 metrics. Every message `ctr task metrics` reads is
/// present (it dereferences them without a check).
fn v1_metrics(s: &Stats) -> v1::Metrics {
    let raw = |key: &str| s.memory.raw.get(key).copied().unwrap_or(0);
    let b = &s.blkio;
    v1::Metrics {
        hugetlb: s
            .hugetlb
            .iter()
            .map(|(pagesize, h)| v1::HugetlbStat {
                usage: h.usage,
                max: h.max,
                failcnt: h.failcnt,
                pagesize: pagesize.clone(),
                ..Default::default()
            })
            .collect(),
        pids: MessageField::some(v1::PidsStat {
            current: s.pids.current,
            limit: s.pids.limit,
            ..Default::default()
        }),
        cpu: MessageField::some(v1::CPUStat {
            usage: MessageField::some(v1::CPUUsage {
                total: s.cpu.usage.total,
                kernel: s.cpu.usage.kernel,
                user: s.cpu.usage.user,
                per_cpu: s.cpu.usage.percpu.clone(),
                ..Default::default()
            }),
            throttling: MessageField::some(v1::Throttle {
                periods: s.cpu.throttling.periods,
                throttled_periods: s.cpu.throttling.throttled_periods,
                throttled_time: s.cpu.throttling.throttled_time,
                ..Default::default()
            }),
            ..Default::default()
        }),
        memory: MessageField::some(v1::MemoryStat {
            cache: s.memory.cache.max(raw("cache")),
            rss: raw("rss"),
            rss_huge: raw("rss_huge"),
            mapped_file: raw("mapped_file"),
            dirty: raw("dirty"),
            writeback: raw("writeback"),
            pg_pg_in: raw("pgpgin"),
            pg_pg_out: raw("pgpgout"),
            pg_fault: raw("pgfault"),
            pg_maj_fault: raw("pgmajfault"),
            inactive_anon: raw("inactive_anon"),
            active_anon: raw("active_anon"),
            inactive_file: raw("inactive_file"),
            active_file: raw("active_file"),
            unevictable: raw("unevictable"),
            hierarchical_memory_limit: raw("hierarchical_memory_limit"),
            hierarchical_swap_limit: raw("hierarchical_memsw_limit"),
            total_cache: raw("total_cache"),
            total_rss: raw("total_rss"),
            total_rss_huge: raw("total_rss_huge"),
            total_mapped_file: raw("total_mapped_file"),
            total_dirty: raw("total_dirty"),
            total_writeback: raw("total_writeback"),
            total_pg_pg_in: raw("total_pgpgin"),
            total_pg_pg_out: raw("total_pgpgout"),
            total_pg_fault: raw("total_pgfault"),
            total_pg_maj_fault: raw("total_pgmajfault"),
            total_inactive_anon: raw("total_inactive_anon"),
            total_active_anon: raw("total_active_anon"),
            total_inactive_file: raw("total_inactive_file"),
            total_active_file: raw("total_active_file"),
            total_unevictable: raw("total_unevictable"),
            usage: v1_entry(&s.memory.usage),
            swap: v1_entry(&s.memory.swap),
            kernel: v1_entry(&s.memory.kernel),
            kernel_tcp: v1_entry(&s.memory.kernel_tcp),
            ..Default::default()
        }),
        blkio: MessageField::some(v1::BlkIOStat {
            io_service_bytes_recursive: v1_blkio(&b.io_service_bytes_recursive),
            io_serviced_recursive: v1_blkio(&b.io_serviced_recursive),
            io_queued_recursive: v1_blkio(&b.io_queued_recursive),
            io_service_time_recursive: v1_blkio(&b.io_service_time_recursive),
            io_wait_time_recursive: v1_blkio(&b.io_wait_time_recursive),
            io_merged_recursive: v1_blkio(&b.io_merged_recursive),
            io_time_recursive: v1_blkio(&b.io_time_recursive),
            sectors_recursive: v1_blkio(&b.sectors_recursive),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A protobuf message being written: proto3, so zero numbers are left
/// out; embedded messages are always written (a reader sees them present).
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    /// A `uint64` field (wire type 0).
    fn uint64(&mut self, field: u32, v: u64) -> &mut Writer {
        if v != 0 {
            self.varint(u64::from(field) << 3);
            self.varint(v);
        }
        self
    }

    /// An embedded message field (wire type 2).
    fn message(&mut self, field: u32, m: Writer) -> &mut Writer {
        self.varint((u64::from(field) << 3) | 2);
        self.varint(m.0.len() as u64);
        self.0.extend_from_slice(&m.0);
        self
    }
}

/// `memory.stat` keys of cgroup v2 in the order (field numbers 1..=31)
/// of containerd's v2 `MemoryStat`.
const V2_MEMORY_STAT: [&str; 31] = [
    "anon",
    "file",
    "kernel_stack",
    "slab",
    "sock",
    "shmem",
    "file_mapped",
    "file_dirty",
    "file_writeback",
    "anon_thp",
    "inactive_anon",
    "active_anon",
    "inactive_file",
    "active_file",
    "unevictable",
    "slab_reclaimable",
    "slab_unreclaimable",
    "pgfault",
    "pgmajfault",
    "workingset_refault",
    "workingset_activate",
    "workingset_nodereclaim",
    "pgrefill",
    "pgscan",
    "pgsteal",
    "pgactivate",
    "pgdeactivate",
    "pglazyfree",
    "pglazyfreed",
    "thp_fault_alloc",
    "thp_collapse_alloc",
];

/// containerd's v2 metrics (`Metrics`: pids 1, cpu 2, memory 4); CPU
/// times in microseconds as cgroup v2's `cpu.stat` has them.
fn v2_metrics(s: &Stats) -> Vec<u8> {
    let mut pids = Writer::default();
    pids.uint64(1, s.pids.current).uint64(2, s.pids.limit);
    let mut cpu = Writer::default();
    let t = &s.cpu.throttling;
    cpu.uint64(1, s.cpu.usage.total / 1000)
        .uint64(2, s.cpu.usage.user / 1000)
        .uint64(3, s.cpu.usage.kernel / 1000)
        .uint64(4, t.periods)
        .uint64(5, t.throttled_periods)
        .uint64(6, t.throttled_time / 1000);
    let mut memory = Writer::default();
    for (field, key) in (1u32..).zip(V2_MEMORY_STAT) {
        memory.uint64(field, s.memory.raw.get(key).copied().unwrap_or(0));
    }
    let m = &s.memory;
    memory
        .uint64(32, m.usage.usage)
        .uint64(33, m.usage.limit)
        .uint64(34, m.swap.usage)
        .uint64(35, m.swap.limit)
        .uint64(36, m.usage.max)
        .uint64(37, m.swap.max);
    let mut metrics = Writer::default();
    metrics.message(1, pids).message(2, cpu).message(4, memory);
    metrics.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim::protos::protobuf::CodedInputStream;

    /// What `agentvm events --stats` prints (abridged), microvm style:
    /// the guest's figures.
    const LINE: &str = r#"{"type":"stats","id":"c1","data":{"cpu":{"usage":{"total":2500000,"kernel":1000000,"user":1500000},"throttling":{}},"cpuset":{},"memory":{"usage":{"limit":268435456,"usage":1048576,"failcnt":0},"swap":{"limit":0,"failcnt":0},"kernel":{"limit":0,"failcnt":0},"kernelTCP":{"limit":0,"failcnt":0},"raw":{"guest_total":268435456,"anon":4096,"total_cache":8192}},"pids":{"current":3},"blkio":{},"hugetlb":{},"intel_rdt":{},"network_interfaces":null}}"#;

    #[test]
    fn v1_metrics_carry_cpu_memory_and_pids() {
        let any = from_events_output(LINE.as_bytes(), CgroupMode::V1).expect("metrics");
        assert_eq!(any.type_url, V1_TYPE_URL);
        let m = v1::Metrics::parse_from_bytes(&any.value).expect("decode");
        assert_eq!(m.pids.current, 3);
        assert_eq!(m.cpu.usage.total, 2_500_000);
        assert_eq!(m.memory.usage.usage, 1_048_576);
        assert_eq!(m.memory.usage.limit, 268_435_456);
        assert_eq!(m.memory.total_cache, 8192);
        // Present even when zero: ctr dereferences them.
        assert!(m.memory.kernel_tcp.is_some() && m.cpu.throttling.is_some());
    }

    /// Reads `(field, value)` of every varint field of a message, and the
    /// bytes of every length-delimited one.
    fn fields(bytes: &[u8]) -> (BTreeMap<u32, u64>, BTreeMap<u32, Vec<u8>>) {
        let mut input = CodedInputStream::from_bytes(bytes);
        let (mut ints, mut msgs) = (BTreeMap::new(), BTreeMap::new());
        while !input.eof().expect("eof") {
            let tag = input.read_raw_varint32().expect("tag");
            match tag & 7 {
                0 => {
                    ints.insert(tag >> 3, input.read_raw_varint64().expect("varint"));
                }
                2 => {
                    msgs.insert(tag >> 3, input.read_bytes().expect("bytes"));
                }
                other => panic!("unexpected wire type {other}"),
            }
        }
        (ints, msgs)
    }

    #[test]
    fn v2_metrics_have_containerds_field_numbers() {
        let any = from_events_output(LINE.as_bytes(), CgroupMode::V2).expect("metrics");
        assert_eq!(any.type_url, V2_TYPE_URL);
        let (_, top) = fields(&any.value);
        let (pids, _) = fields(&top[&1]);
        assert_eq!(pids.get(&1), Some(&3));
        let (cpu, _) = fields(&top[&2]);
        assert_eq!(
            (cpu.get(&1), cpu.get(&2), cpu.get(&3)),
            (Some(&2500), Some(&1500), Some(&1000))
        );
        let (memory, _) = fields(&top[&4]);
        assert_eq!(memory.get(&1), Some(&4096), "anon");
        assert_eq!(memory.get(&32), Some(&1_048_576), "usage");
        assert_eq!(memory.get(&33), Some(&268_435_456), "usage_limit");
    }

    #[test]
    fn output_without_stats_is_an_error() {
        let err = from_events_output(b"{\"type\":\"oom\",\"id\":\"c1\"}\n", CgroupMode::V1)
            .expect_err("no stats");
        assert!(err.to_string().contains("no stats line"), "{err}");
        assert!(from_events_output(b"", CgroupMode::V2).is_err());
    }

    #[test]
    fn large_numbers_are_varints() {
        let mut w = Writer::default();
        w.uint64(33, u64::MAX);
        let (ints, _) = fields(&w.0);
        assert_eq!(ints.get(&33), Some(&u64::MAX));
    }
}
