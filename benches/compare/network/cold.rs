//! What networking adds to `docker run --rm local/busybox true`: the same
//! command on Docker's default bridge and with `--network none`, in the
//! same interleaved rounds, per runtime.

use std::time::Duration;

use super::render::signed;
use super::NetRow;
use crate::common::docker::Docker;
use crate::common::rootfs::IMAGE;
use crate::stats::{ms, summarize, Series, Summary};
use crate::{docker_run, failure_notes, interleave, Entry, Options, Schedule};

/// One runtime on one network.
struct ColdEntry {
    name: &'static str,
    docker_name: &'static str,
    slow: bool,
    bridge: bool,
}

impl Entry for ColdEntry {
    fn name(&self) -> &'static str {
        self.name
    }
    fn slow(&self) -> bool {
        self.slow
    }
}

fn ratio(v: Duration, base: Option<Duration>) -> String {
    match base {
        Some(b) if !b.is_zero() => format!("{:.2}×", v.as_secs_f64() / b.as_secs_f64()),
        _ => "n/a".to_string(),
    }
}

/// The cold-start section and whether every round passed.
pub fn part(opts: &Options, d: &Docker, rows: &[NetRow]) -> (String, bool) {
    let mut entries = Vec::new();
    for row in rows {
        if let Ok(docker_name) = row.docker_name {
            for bridge in [true, false] {
                entries.push(ColdEntry {
                    name: row.name,
                    docker_name,
                    slow: row.slow,
                    bridge,
                });
            }
        }
    }
    let schedule = Schedule::new(opts.net_rounds, opts.microvm_rounds, opts.warmup.min(1));
    let series = interleave(&entries, schedule, "network cold start", |e, _| {
        let opts: &[&str] = if e.bridge {
            &[]
        } else {
            &["--network", "none"]
        };
        docker_run::run_true(d, e.docker_name, opts)
    });
    let of = |name: &str, bridge: bool| -> Option<&Series<Duration>> {
        entries
            .iter()
            .zip(&series)
            .find(|(e, _)| e.name == name && e.bridge == bridge)
            .map(|(_, s)| s)
    };
    let summary = |s: Option<&Series<Duration>>| -> Option<Summary> {
        s.and_then(|s| summarize(s.samples.iter().copied()))
    };
    let runc = |bridge: bool| summary(of(crate::runtimes::REFERENCE, bridge)).map(|s| s.median);
    let mut table = String::from(
        "| runtime | bridge median | bridge p90 | none median | none p90 | networking adds (median) \
         | bridge ÷ runc | none ÷ runc | rounds ok / failed (bridge; none) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let cells: Vec<String> = match &row.docker_name {
            Err(why) => {
                let mut v = vec![why.text()];
                v.resize(8, "–".to_string());
                v
            }
            Ok(_) => {
                let (b, n) = (of(row.name, true), of(row.name, false));
                let (sb, sn) = (summary(b), summary(n));
                let dash = || "–".to_string();
                let count = |s: Option<&Series<Duration>>| {
                    s.map_or_else(dash, |s| {
                        format!("{} / {}", s.samples.len(), s.failures.len())
                    })
                };
                vec![
                    sb.map_or_else(dash, |s| ms(s.median)),
                    sb.map_or_else(dash, |s| ms(s.p90)),
                    sn.map_or_else(dash, |s| ms(s.median)),
                    sn.map_or_else(dash, |s| ms(s.p90)),
                    match (sb, sn) {
                        (Some(b), Some(n)) => signed(b.median, n.median, ms),
                        _ => dash(),
                    },
                    sb.map_or_else(dash, |s| ratio(s.median, runc(true))),
                    sn.map_or_else(dash, |s| ratio(s.median, runc(false))),
                    format!("{}; {}", count(b), count(n)),
                ]
            }
        };
        table.push_str(&format!("| {} | {} |\n", row.name, cells.join(" | ")));
    }
    let ok = series.iter().all(|s| s.failures.is_empty());
    let section = format!(
        "### Cold start with and without a network: `docker run --rm --runtime RT [--network none] \
         {IMAGE} true`\n\n\
         {} (each runtime on the default bridge and with `--network none` counts as two \
         entries). Wall clock of the `docker` client; \"networking adds\" is the bridge's \
         median minus `--network none`'s:\n\n{table}{}",
        schedule.describe(&entries),
        failure_notes(&series)
    );
    (section, ok)
}
