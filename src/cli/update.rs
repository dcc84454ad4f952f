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
    #[arg(long = "cpu-quota")]
    pub cpu_quota: Option<i64>,
    #[arg(long = "cpu-rt-period")]
    pub cpu_rt_period: Option<u64>,
    #[arg(long = "cpu-rt-runtime")]
    pub cpu_rt_runtime: Option<i64>,
    #[arg(long = "cpu-share")]
    pub cpu_share: Option<u64>,
    #[arg(long = "cpuset-cpus")]
    pub cpuset_cpus: Option<String>,
    #[arg(long = "cpuset-mems")]
    pub cpuset_mems: Option<String>,
    #[arg(long = "memory")]
    pub memory: Option<String>,
    #[arg(long = "memory-reservation")]
    pub memory_reservation: Option<String>,
    #[arg(long = "memory-swap")]
    pub memory_swap: Option<String>,
    #[arg(long = "kernel-memory")]
    pub kernel_memory: Option<String>,
    #[arg(long = "kernel-memory-tcp")]
    pub kernel_memory_tcp: Option<String>,
    #[arg(long = "pids-limit")]
    pub pids_limit: Option<i64>,
    #[arg(long = "l3-cache-schema")]
    pub l3_cache_schema: Option<String>,
    #[arg(long = "mem-bw-schema")]
    pub mem_bw_schema: Option<String>,
    pub id: String,
}

/// Parses sizes as runc does: a number with an optional k/m/g/t suffix
/// (binary units), or -1 for unlimited.
pub fn parse_size(s: &str) -> anyhow::Result<i64> {
    let t = s.trim().to_ascii_lowercase();
    if t == "-1" {
        return Ok(-1);
    }
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1i64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        Some('t') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: i64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("invalid size {s:?}"))?;
    n.checked_mul(mult)
        .filter(|v| *v >= 0)
        .ok_or_else(|| anyhow::anyhow!("invalid size {s:?}"))
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
    let size = |o: &Option<String>| o.as_deref().map(parse_size).transpose();
    if let Some(v) = size(&args.memory)? {
        mem.set_limit(Some(v));
    }
    if let Some(v) = size(&args.memory_reservation)? {
        mem.set_reservation(Some(v));
    }
    if let Some(v) = size(&args.memory_swap)? {
        mem.set_swap(Some(v));
    }
    if let Some(v) = size(&args.kernel_memory)? {
        mem.set_kernel(Some(v));
    }
    if let Some(v) = size(&args.kernel_memory_tcp)? {
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

pub fn run(ctx: &Context, args: UpdateArgs) -> anyhow::Result<()> {
    crate::bundle::validate_id(&args.id)?;
    let base = match &args.resources {
        Some(p) => read_resources(p)?,
        None => LinuxResources::default(),
    };
    let resources = merge_flags(&args, base)?;
    let (tier, _lock) = super::open(ctx, &args.id, Some(LockMode::Exclusive))?;
    Ok(tier.update(ctx, &args.id, &resources)?)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64m").unwrap(), 64 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("-1").unwrap(), -1);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-5").is_err());
    }
}
