//! `agentvm update`

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use oci_spec::runtime::{
    LinuxBlockIoBuilder, LinuxMemoryBuilder, LinuxPidsBuilder, LinuxResources,
};

use crate::context::Context;
use crate::state::LockMode;

#[derive(Args, Debug)]
pub struct UpdateArgs {
    /// JSON file with LinuxResources to apply ("-" for stdin)
    #[arg(short, long)]
    pub resources: Option<PathBuf>,
    #[arg(long = "blkio-weight")]
    pub blkio_weight: Option<u16>,
    #[arg(long = "cpu-period")]
    pub cpu_period: Option<u64>,
    #[arg(long = "cpu-quota", allow_negative_numbers = true)]
    pub cpu_quota: Option<i64>,
    #[arg(long = "cpu-rt-period")]
    pub cpu_rt_period: Option<u64>,
    #[arg(long = "cpu-rt-runtime", allow_negative_numbers = true)]
    pub cpu_rt_runtime: Option<i64>,
    #[arg(long = "cpu-share")]
    pub cpu_share: Option<u64>,
    #[arg(long = "cpuset-cpus")]
    pub cpuset_cpus: Option<String>,
    #[arg(long = "cpuset-mems")]
    pub cpuset_mems: Option<String>,
    #[arg(long = "memory", allow_negative_numbers = true)]
    pub memory: Option<String>,
    #[arg(long = "memory-reservation", allow_negative_numbers = true)]
    pub memory_reservation: Option<String>,
    #[arg(long = "memory-swap", allow_negative_numbers = true)]
    pub memory_swap: Option<String>,
    #[arg(long = "kernel-memory", allow_negative_numbers = true)]
    pub kernel_memory: Option<String>,
    #[arg(long = "kernel-memory-tcp", allow_negative_numbers = true)]
    pub kernel_memory_tcp: Option<String>,
    #[arg(long = "pids-limit", allow_negative_numbers = true)]
    pub pids_limit: Option<i64>,
    #[arg(long = "l3-cache-schema")]
    pub l3_cache_schema: Option<String>,
    #[arg(long = "mem-bw-schema")]
    pub mem_bw_schema: Option<String>,
    pub id: String,
}

/// Parses a size as runc does (docker/go-units' `RAMInBytes`): `-1` for
/// unlimited, else a decimal number, an optional space, an optional binary
/// unit k, m, g, t or p, an optional `i` and an optional `b`, in any case
/// (`1g`, `1.5G`, `512 MiB`, `1024`).
pub fn parse_size(s: &str) -> anyhow::Result<i64> {
    if s == "-1" {
        return Ok(-1);
    }
    let bad = || anyhow::anyhow!("invalid size: '{s}'");
    let digits = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(digits);
    if num.is_empty() || !num.starts_with(|c: char| c.is_ascii_digit()) || num.ends_with('.') {
        return Err(bad());
    }
    // What follows the number: ` ?([kmgtp])?i?b?`, case aside.
    let mut rest = unit.strip_prefix(' ').unwrap_or(unit).chars().peekable();
    let shift = match rest.peek().map(char::to_ascii_lowercase) {
        Some(c @ ('k' | 'm' | 'g' | 't' | 'p')) => {
            rest.next();
            10 * (1 + "kmgtp".find(c).unwrap_or(0) as u32)
        }
        _ => 0,
    };
    rest.next_if(|c| c.eq_ignore_ascii_case(&'i'));
    rest.next_if(|c| c.eq_ignore_ascii_case(&'b'));
    if rest.next().is_some() {
        return Err(bad());
    }
    let value: f64 = num.parse().map_err(|_| bad())?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= i64::MAX as f64 {
        return Err(bad());
    }
    // Truncated as Go's int64(float64) conversion does.
    Ok(bytes as i64)
}

fn read_resources(path: &PathBuf) -> anyhow::Result<LinuxResources> {
    let mut text = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .read_to_end(&mut text)
            .context("cannot read resources from stdin")?;
    } else {
        text = std::fs::read(path)
            .with_context(|| format!("cannot read resources file {}", path.display()))?;
    }
    serde_json::from_slice(&text).context("invalid resources JSON")
}

fn merge_flags(args: &UpdateArgs, mut r: LinuxResources) -> anyhow::Result<LinuxResources> {
    if args.l3_cache_schema.is_some() || args.mem_bw_schema.is_some() {
        anyhow::bail!("Intel RDT updates (--l3-cache-schema, --mem-bw-schema) are not supported");
    }
    let mut mem = (*r.memory()).unwrap_or_default();
    let size = |flag: &str, o: &Option<String>| {
        o.as_deref()
            .map(parse_size)
            .transpose()
            .with_context(|| format!("invalid value for {flag}"))
    };
    if let Some(v) = size("memory", &args.memory)? {
        mem.set_limit(Some(v));
    }
    if let Some(v) = size("memory-reservation", &args.memory_reservation)? {
        mem.set_reservation(Some(v));
    }
    if let Some(v) = size("memory-swap", &args.memory_swap)? {
        mem.set_swap(Some(v));
    }
    if let Some(v) = size("kernel-memory", &args.kernel_memory)? {
        mem.set_kernel(Some(v));
    }
    if let Some(v) = size("kernel-memory-tcp", &args.kernel_memory_tcp)? {
        mem.set_kernel_tcp(Some(v));
    }
    if mem != LinuxMemoryBuilder::default().build()? {
        r.set_memory(Some(mem));
    }
    let mut cpu = r.cpu().clone().unwrap_or_default();
    let before = cpu.clone();
    if let Some(v) = args.cpu_period {
        cpu.set_period(Some(v));
    }
    if let Some(v) = args.cpu_quota {
        cpu.set_quota(Some(v));
    }
    if let Some(v) = args.cpu_share {
        cpu.set_shares(Some(v));
    }
    if let Some(v) = args.cpu_rt_period {
        cpu.set_realtime_period(Some(v));
    }
    if let Some(v) = args.cpu_rt_runtime {
        cpu.set_realtime_runtime(Some(v));
    }
    if let Some(v) = &args.cpuset_cpus {
        cpu.set_cpus(Some(v.clone()));
    }
    if let Some(v) = &args.cpuset_mems {
        cpu.set_mems(Some(v.clone()));
    }
    if cpu != before || r.cpu().is_some() {
        r.set_cpu(Some(cpu));
    }
    if let Some(v) = args.pids_limit {
        r.set_pids(Some(LinuxPidsBuilder::default().limit(v).build()?));
    }
    if let Some(w) = args.blkio_weight {
        let mut b = r
            .block_io()
            .clone()
            .unwrap_or_else(|| LinuxBlockIoBuilder::default().build().unwrap_or_default());
        b.set_weight(Some(w));
        r.set_block_io(Some(b));
    }
    Ok(r)
}

/// runc's `update` reads a zero (and an empty cpuset) as "leave it as it
/// is", not as a value: Docker and containerd send every field, zeros for
/// what the user did not set (`docker update --cpus 1` sends a memory limit
/// of 0, `docker update --memory 1g` a CPU quota and period of 0). Written
/// as values, a quota and period of 0 are `max 0` in a cgroup v2 `cpu.max`
/// (EINVAL) and a pids limit of 0 is 1; so zeros become unset fields here.
/// A quota without a period (or the reverse) keeps the other's old value,
/// as runc's does.
fn unset_zeros(mut r: LinuxResources) -> LinuxResources {
    fn nonzero<T: Default + PartialEq>(v: Option<T>) -> Option<T> {
        v.filter(|v| *v != T::default())
    }
    if let Some(mut m) = *r.memory() {
        m.set_limit(nonzero(m.limit()));
        m.set_reservation(nonzero(m.reservation()));
        m.set_swap(nonzero(m.swap()));
        m.set_kernel(nonzero(m.kernel()));
        m.set_kernel_tcp(nonzero(m.kernel_tcp()));
        r.set_memory(Some(m));
    }
    if let Some(mut c) = r.cpu().clone() {
        c.set_shares(nonzero(c.shares()));
        c.set_quota(nonzero(c.quota()));
        c.set_period(nonzero(c.period()));
        c.set_realtime_runtime(nonzero(c.realtime_runtime()));
        c.set_realtime_period(nonzero(c.realtime_period()));
        c.set_cpus(c.cpus().clone().filter(|s| !s.is_empty()));
        c.set_mems(c.mems().clone().filter(|s| !s.is_empty()));
        r.set_cpu(Some(c));
    }
    if let Some(mut b) = r.block_io().clone() {
        b.set_weight(nonzero(b.weight()));
        b.set_leaf_weight(nonzero(b.leaf_weight()));
        r.set_block_io(Some(b));
    }
    if r.pids().as_ref().is_some_and(|p| p.limit() == 0) {
        r.set_pids(None);
    }
    r
}

pub fn run(ctx: &Context, args: UpdateArgs) -> anyhow::Result<()> {
    crate::bundle::validate_id(&args.id)?;
    let base = match &args.resources {
        Some(p) => read_resources(p)?,
        None => LinuxResources::default(),
    };
    let resources = unset_zeros(merge_flags(&args, base)?);
    let (tier, _lock) = super::open(ctx, &args.id, Some(LockMode::Exclusive))?;
    Ok(tier.update(ctx, &args.id, &resources)?)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_as_runc_takes_them() {
        assert_eq!(parse_size("64m").unwrap(), 64 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1gb").unwrap(), 1 << 30);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("512 M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1p").unwrap(), 1 << 50);
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("-1").unwrap(), -1);
        // The pattern's optional parts alone, as go-units' regex allows.
        assert_eq!(parse_size("1 ").unwrap(), 1);
        assert_eq!(parse_size("2b").unwrap(), 2);
        assert_eq!(parse_size("2i").unwrap(), 2);
    }

    #[test]
    fn sizes_runc_refuses() {
        for s in [
            "lots", "-5", "-2", "", "g", "1x", "1.", ".5g", "1  g", "1e3", "1gg", "99999p",
        ] {
            assert!(parse_size(s).is_err(), "{s:?} accepted");
        }
        let e = parse_size("-2").unwrap_err();
        assert_eq!(e.to_string(), "invalid size: '-2'");
    }

    #[test]
    fn zeros_docker_sends_for_what_it_leaves_alone_are_unset() {
        let sent = r#"{"memory":{"limit":0,"reservation":0,"swap":0,"kernel":0},
            "cpu":{"shares":0,"quota":0,"period":0,"cpus":"","mems":""},
            "blockIO":{"weight":0},"pids":{"limit":0}}"#;
        let r = super::unset_zeros(serde_json::from_str(sent).unwrap());
        let m = r.memory().unwrap();
        assert_eq!(
            (m.limit(), m.reservation(), m.swap(), m.kernel()),
            (None, None, None, None)
        );
        let c = r.cpu().clone().unwrap();
        assert_eq!((c.shares(), c.quota(), c.period()), (None, None, None));
        assert_eq!((c.cpus().clone(), c.mems().clone()), (None, None));
        assert_eq!(r.block_io().clone().unwrap().weight(), None);
        assert!(r.pids().is_none());
        // What is set stays, -1 (unlimited) included; a quota alone keeps
        // no period (the cgroup's stays).
        let sent = r#"{"memory":{"limit":104857600,"swap":-1},"cpu":{"quota":50000,"period":0},
            "pids":{"limit":-1}}"#;
        let r = super::unset_zeros(serde_json::from_str(sent).unwrap());
        let m = r.memory().unwrap();
        assert_eq!((m.limit(), m.swap()), (Some(104857600), Some(-1)));
        let c = r.cpu().clone().unwrap();
        assert_eq!((c.quota(), c.period()), (Some(50000), None));
        assert_eq!(r.pids().as_ref().map(|p| p.limit()), Some(-1));
    }
}
