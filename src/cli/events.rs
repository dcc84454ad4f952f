//! `agentvm events`: the container's resource statistics as runc's event
//! lines, `{"type":"stats","id":...,"data":{...}}`, once with `--stats` or
//! every `--interval` until the container stops.
//!
//! Beside runc's figures, `data.egress` adds up the container's connection
//! lines in the audit file (`allowed`, `denied` with the attempts a line
//! stands for, `bytes_out`, `bytes_in`); the file is read once, then only
//! what each interval appended.

use std::io::Write;
use std::time::Duration;

use crate::audit::read::Tally;
use crate::context::Context;
use crate::state::{lock_container, LockMode};
use clap::Args;

#[derive(Args, Debug)]
pub struct EventsArgs {
    /// Time between stats samples, as runc takes it ("5s", "500ms")
    #[arg(long, default_value = "5s")]
    pub interval: String,
    /// Print the container's stats once and exit
    #[arg(long)]
    pub stats: bool,
    pub id: String,
}

/// One event line, fields in runc's order.
#[derive(serde::Serialize)]
struct Event<'a, T> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: &'a str,
    data: T,
}

fn parse_interval(s: &str) -> anyhow::Result<Duration> {
    let bad = || anyhow::anyhow!("invalid --interval {s:?}: expected a duration like 5s or 500ms");
    let d = if let Some(ms) = s.strip_suffix("ms") {
        Duration::from_millis(ms.parse().map_err(|_| bad())?)
    } else if let Some(m) = s.strip_suffix('m') {
        Duration::from_secs(m.parse::<u64>().map_err(|_| bad())?.saturating_mul(60))
    } else {
        Duration::from_secs(
            s.strip_suffix('s')
                .unwrap_or(s)
                .parse()
                .map_err(|_| bad())?,
        )
    };
    if d.is_zero() {
        return Err(bad());
    }
    Ok(d)
}

pub fn run(ctx: &Context, args: EventsArgs) -> anyhow::Result<()> {
    let interval = parse_interval(&args.interval)?;
    let (tier, _) = super::open(ctx, &args.id, None)?;
    let mut out = std::io::stdout().lock();
    let audit = ctx.config.audit.path();
    let mut tally = Tally::new(&audit, &args.id);
    loop {
        let stats = {
            let _lock = lock_container(&ctx.root, &args.id, LockMode::Shared)?;
            tier.stats(ctx, &args.id)?
        };
        let Some(stats) = stats else {
            if args.stats {
                anyhow::bail!("container {} is not running", args.id);
            }
            return Ok(());
        };
        let mut data = serde_json::to_value(stats)?;
        match tally.update() {
            Ok(counts) => {
                if let Some(map) = data.as_object_mut() {
                    map.insert("egress".to_string(), serde_json::to_value(counts)?);
                }
            }
            Err(e) => tracing::warn!("no egress counts: cannot read {}: {e}", audit.display()),
        }
        let line = serde_json::to_string(&Event {
            kind: "stats",
            id: &args.id,
            data,
        })?;
        // A reader that went away (e.g. `| head`) ends the stream quietly.
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
            return Ok(());
        }
        if args.stats {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_interval("7").unwrap(), Duration::from_secs(7));
        assert_eq!(parse_interval("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_interval("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_interval("0s").is_err());
        assert!(parse_interval("soon").is_err());
    }
}
