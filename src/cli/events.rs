//! `agentvm events`: runc's event lines. With `--stats`, one
//! `{"type":"stats","id":...,"data":{...}}` and exit; otherwise a stats line
//! every `--interval` (the first after one interval, as runc's ticker) and
//! an `{"type":"oom","id":...}` line for each OOM kill in the container,
//! until the container stops. The stats are runc 1.1's fields
//! (`crate::events::Stats`).
//!
//! `--oom-since-create` (agentvm's own) reports every kill the container's
//! cgroup has counted, also those before this command looked first: the
//! shim starts `events` right after `create`, and a workload killed at once
//! by its limit may be killed before the first look, and even stop before
//! this command starts: a stopped container then gets one look (its kills
//! printed, exit 0) where runc says it is not running. `--oom-interval`
//! (also agentvm's) sets how often the count is read: in the microvm tier
//! each look is a question to the guest, which costs an idle VM under TCG
//! a few percent of a CPU at the default 100 ms; the shim looks once a
//! second (a kill that ends the container is still seen at its end).
//!
//! `SIGURG` cuts a wait between looks short (agentvm's own): the shim sends
//! it when the container's init has exited, so the last look, and the end
//! of the stream that the shim waits for before it reports the exit, come
//! at once rather than up to an `--oom-interval` later. SIGURG is ignored
//! by default, so one sent before this command blocks it does nothing.
//!
//! Beside runc's figures, `data.egress` adds up the container's connection
//! lines in the audit file (`allowed`, `denied` with the attempts a line
//! stands for, `bytes_out`, `bytes_in`); the file is read once, then only
//! what each interval appended.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::audit::read::{EgressCounts, Tally};
use crate::context::Context;
use crate::events::Event;
use crate::state::{lock_container, LockMode};
use crate::tier::{OomWatch, Tier};
use clap::Args;

/// How often the OOM-kill count is read between stats samples, unless
/// `--oom-interval` says otherwise.
const OOM_POLL: &str = "100ms";

#[derive(Args, Debug)]
pub struct EventsArgs {
    /// Time between stats samples, as runc takes it ("5s", "500ms")
    #[arg(long, default_value = "5s")]
    pub interval: String,
    /// Print the container's stats once and exit
    #[arg(long)]
    pub stats: bool,
    /// Report every OOM kill the container has had, not only those after
    /// the first look (agentvm's shim runs events right after create); a
    /// container already stopped gets that one look instead of an error
    #[arg(long = "oom-since-create")]
    pub oom_since_create: bool,
    /// Time between looks at the OOM-kill count (and at whether the
    /// container has stopped), as --interval takes it
    #[arg(long = "oom-interval", default_value = OOM_POLL)]
    pub oom_interval: String,
    pub id: String,
}

/// A duration as runc takes `--interval` (Go's `time.ParseDuration`): one
/// or more decimal numbers, each with a unit `ns`, `us`, `µs`, `ms`, `s`,
/// `m` or `h` (`5s`, `1.5s`, `1h30m`, `250ms`); it must be above zero.
fn parse_interval(s: &str) -> anyhow::Result<Duration> {
    parse_duration("--interval", s)
}

/// [`parse_interval`] for the option `flag`.
fn parse_duration(flag: &str, s: &str) -> anyhow::Result<Duration> {
    let bad = || anyhow::anyhow!("invalid {flag} {s:?}: expected a duration like 5s or 500ms");
    let mut rest = s;
    let mut nanos: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let value: f64 = num.parse().map_err(|_| bad())?;
        let scale = match unit {
            "ns" => 1e0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        nanos += value * scale;
        rest = tail;
    }
    if !(nanos >= 1.0 && nanos < u64::MAX as f64) {
        return Err(anyhow::anyhow!(
            "invalid {flag} {s:?}: duration interval must be greater than 0"
        ));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

pub fn run(ctx: &Context, args: EventsArgs) -> anyhow::Result<()> {
    let interval = parse_interval(&args.interval)?;
    let oom_poll = parse_duration("--oom-interval", &args.oom_interval)?;
    let (tier, _) = super::open(ctx, &args.id, None)?;
    let id = args.id.as_str();
    let not_running = || anyhow::anyhow!("container with id {id} is not running");
    // runc refuses a stopped container. The shim's watch (--oom-since-create)
    // may start only after a workload over its limit was killed and the
    // container stopped: it still gets its one look, and the kill.
    let stopped = tier.state(ctx, id)?.status == "stopped";
    if stopped && (args.stats || !args.oom_since_create) {
        return Err(not_running());
    }
    let mut out = Lines(std::io::stdout().lock());
    let mut tally = Tally::new(&ctx.config.audit.path(), id);
    if args.stats {
        let stats = sample(ctx, tier.as_ref(), id, &mut tally)?.ok_or_else(not_running)?;
        out.put(&stats_event(id, stats));
        return Ok(());
    }
    let mut oom = match tier.oom_watch(ctx, id) {
        Ok(mut watch) => watch.kills(ctx).ok().map(|seen| {
            let seen = if args.oom_since_create { 0 } else { seen };
            (watch, seen)
        }),
        Err(e) => {
            tracing::warn!("container {id}: OOM kills are not reported: {e}");
            None
        }
    };
    if stopped {
        report_ooms(ctx, id, &mut oom, &mut out);
        return Ok(());
    }
    let wake = Wake::block();
    let mut next = Instant::now() + interval;
    loop {
        if !report_ooms(ctx, id, &mut oom, &mut out) {
            return Ok(());
        }
        if Instant::now() >= next {
            next += interval;
            match sample(ctx, tier.as_ref(), id, &mut tally) {
                Ok(Some(stats)) => {
                    if !out.put(&stats_event(id, stats)) {
                        return Ok(());
                    }
                }
                Ok(None) => break,
                // As runc: a failed sample is logged and the stream goes on.
                Err(e) => tracing::error!("{e:#}"),
            }
        } else if tier.state(ctx, id).map_or(true, |s| s.status == "stopped") {
            break;
        }
        let wait = next.saturating_duration_since(Instant::now());
        // Without an OOM count to read the stop is still looked for as
        // often, so the stream ends when the container does.
        wake.sleep(wait.min(oom_poll));
    }
    // A kill that ended the container is counted before it is seen stopped.
    report_ooms(ctx, id, &mut oom, &mut out);
    Ok(())
}

/// The wake-up signal, blocked in this thread so that a wait can take it
/// (`sigtimedwait`); `None` if it could not be blocked (waits are then
/// plain sleeps).
struct Wake(Option<nix::sys::signal::SigSet>);

impl Wake {
    fn block() -> Wake {
        use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
        let mut set = SigSet::empty();
        set.add(Signal::SIGURG);
        match pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None) {
            Ok(()) => Wake(Some(set)),
            Err(e) => {
                tracing::warn!("cannot block SIGURG, the wait is not cut short: {e}");
                Wake(None)
            }
        }
    }

    /// Waits `d`, or less if the wake-up signal comes.
    fn sleep(&self, d: Duration) {
        let Some(set) = &self.0 else {
            std::thread::sleep(d);
            return;
        };
        let deadline = Instant::now() + d;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let ts = libc::timespec {
                tv_sec: libc::time_t::try_from(left.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: libc::c_long::from(left.subsec_nanos()),
            };
            // SAFETY: `set` is an initialised sigset_t that outlives the
            // call, a null info pointer is allowed, and `ts` is a valid
            // timespec for the duration of the call.
            let r = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &ts) };
            if r >= 0 {
                return;
            }
            // EAGAIN: the time is up; EINTR: another signal, wait on.
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return;
            }
        }
    }
}

/// Stdout, one JSON line per event; `put` is false once the reader has
/// gone away (e.g. `| head`), which ends the stream quietly.
struct Lines<W: Write>(W);

impl<W: Write> Lines<W> {
    fn put(&mut self, event: &impl serde::Serialize) -> bool {
        let Ok(line) = serde_json::to_string(event) else {
            return false;
        };
        writeln!(self.0, "{line}")
            .and_then(|_| self.0.flush())
            .is_ok()
    }
}

/// Prints one `oom` event per kill counted since the last look; false when
/// stdout has gone away.
fn report_ooms<W: Write>(
    ctx: &Context,
    id: &str,
    oom: &mut Option<(Box<dyn OomWatch>, u64)>,
    out: &mut Lines<W>,
) -> bool {
    let Some((watch, seen)) = oom else {
        return true;
    };
    // A count that cannot be read now (a microVM shutting down) may be
    // read on the next look, or at the end from what the tier kept.
    let Ok(kills) = watch.kills(ctx) else {
        return true;
    };
    for _ in *seen..kills {
        let event = Event::<()> {
            kind: "oom",
            id,
            data: None,
        };
        if !out.put(&event) {
            return false;
        }
    }
    *seen = kills.max(*seen);
    true
}

/// The data of a `stats` event: runc's fields in runc's order, then ours.
#[derive(serde::Serialize)]
struct StatsData {
    #[serde(flatten)]
    stats: crate::events::Stats,
    #[serde(skip_serializing_if = "Option::is_none")]
    egress: Option<EgressCounts>,
}

/// The data of one `stats` event, with the egress counts; `None` once
/// stopped.
fn sample(
    ctx: &Context,
    tier: &dyn Tier,
    id: &str,
    tally: &mut Tally,
) -> anyhow::Result<Option<StatsData>> {
    let stats = {
        let _lock = lock_container(&ctx.root, id, LockMode::Shared)?;
        tier.stats(ctx, id)?
    };
    let Some(stats) = stats else {
        return Ok(None);
    };
    let egress = match tally.update() {
        Ok(counts) => Some(counts),
        Err(e) => {
            tracing::warn!(
                "no egress counts: cannot read {}: {e}",
                ctx.config.audit.path().display()
            );
            None
        }
    };
    Ok(Some(StatsData { stats, egress }))
}

fn stats_event(id: &str, data: StatsData) -> Event<'_, StatsData> {
    Event {
        kind: "stats",
        id,
        data: Some(data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_interval("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_interval("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_interval("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_interval("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_interval("10us").unwrap(), Duration::from_micros(10));
        // As Go's ParseDuration: a number needs its unit.
        assert!(parse_interval("7").is_err());
        assert!(parse_interval("0s").is_err());
        assert!(parse_interval("").is_err());
        assert!(parse_interval("soon").is_err());
        assert!(parse_interval("5x").is_err());
        let err = parse_duration("--oom-interval", "0s")
            .unwrap_err()
            .to_string();
        assert!(err.contains("--oom-interval"), "{err}");
    }
}
