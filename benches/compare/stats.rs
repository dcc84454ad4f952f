//! Medians, percentiles and the tables that compare runtimes with runc
//! and crun.

use std::time::Duration;

use crate::runtimes::{FAST_PEER, REFERENCE};

/// The samples of one runtime in one part of the benchmark.
#[derive(Debug)]
pub struct Series<T> {
    pub name: &'static str,
    pub samples: Vec<T>,
    /// One message per failed round.
    pub failures: Vec<String>,
}

impl<T> Series<T> {
    pub fn new(name: &'static str) -> Series<T> {
        Series {
            name,
            samples: Vec::new(),
            failures: Vec::new(),
        }
    }
}

/// Median and 90th percentile of a set of durations.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub median: Duration,
    pub p90: Duration,
}

/// Median (mean of the two middle values for an even count) and p90
/// (nearest rank); `None` for no samples.
pub fn summarize(values: impl IntoIterator<Item = Duration>) -> Option<Summary> {
    let mut v: Vec<Duration> = values.into_iter().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2
    };
    // Nearest rank: the smallest value with at least 90% of samples <= it.
    let rank = (n * 9).div_ceil(10).max(1);
    Some(Summary {
        median,
        p90: v[rank - 1],
    })
}

pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn ratio(value: Duration, base: Option<Duration>) -> String {
    match base {
        Some(b) if !b.is_zero() => format!("{:.2}×", value.as_secs_f64() / b.as_secs_f64()),
        _ => "n/a".to_string(),
    }
}

/// One row of a comparison table.
pub struct Row {
    pub name: &'static str,
    pub summary: Option<Summary>,
    pub ok: usize,
    pub failed: usize,
}

impl Row {
    pub fn from_series<T>(s: &Series<T>, metric: impl Fn(&T) -> Duration) -> Row {
        Row {
            name: s.name,
            summary: summarize(s.samples.iter().map(metric)),
            ok: s.samples.len(),
            failed: s.failures.len(),
        }
    }
}

/// The table of medians and p90s, each with its ratio to runc and crun.
pub fn ratio_table(rows: &[Row]) -> String {
    let base = |name: &str| rows.iter().find(|r| r.name == name).and_then(|r| r.summary);
    let (runc, crun) = (base(REFERENCE), base(FAST_PEER));
    let mut out = String::from(
        "| runtime | median | p90 | median ÷ runc | p90 ÷ runc | median ÷ crun | p90 ÷ crun | rounds ok / failed |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let cells = match r.summary {
            Some(s) => [
                ms(s.median),
                ms(s.p90),
                ratio(s.median, runc.map(|b| b.median)),
                ratio(s.p90, runc.map(|b| b.p90)),
                ratio(s.median, crun.map(|b| b.median)),
                ratio(s.p90, crun.map(|b| b.p90)),
            ],
            None => std::array::from_fn(|_| "–".to_string()),
        };
        out.push_str(&format!(
            "| {} | {} | {} / {} |\n",
            r.name,
            cells.join(" | "),
            r.ok,
            r.failed
        ));
    }
    out
}

/// A table of per-phase medians: one row per runtime, one column per
/// phase, each cell "median (ratio to runc's median)".
pub fn phase_table(phases: &[&str], rows: &[(&'static str, Vec<Option<Duration>>)]) -> String {
    let runc = rows.iter().find(|(n, _)| *n == REFERENCE).map(|(_, v)| v);
    let mut out = format!("| runtime | {} |\n|---|", phases.join(" | "));
    out.push_str(&"---:|".repeat(phases.len()));
    out.push('\n');
    for (name, medians) in rows {
        let cells: Vec<String> = medians
            .iter()
            .enumerate()
            .map(|(i, m)| match m {
                Some(m) => {
                    let base = runc.and_then(|v| v.get(i).copied().flatten());
                    format!("{} ({})", ms(*m), ratio(*m, base))
                }
                None => "–".to_string(),
            })
            .collect();
        out.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    }
    out
}

/// Median of integers (mean of the two middle ones for an even count).
pub fn median_u64(values: impl IntoIterator<Item = u64>) -> Option<u64> {
    let mut v: Vec<u64> = values.into_iter().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2
    })
}

/// KiB as MiB, one decimal.
pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// One row of the idle-memory table: medians per container, in KiB.
pub struct MemRow {
    pub name: &'static str,
    pub processes: Option<u64>,
    pub rss: Option<u64>,
    pub pss: Option<u64>,
    /// Guest pages touched (microVMs only).
    pub guest: Option<u64>,
    pub ok: usize,
    pub failed: usize,
}

/// How many containers of `pss_kib` each fit in 8 GiB (`None` for 0).
pub fn fit_in_8_gib(pss_kib: u64) -> Option<u64> {
    const EIGHT_GIB_KIB: u64 = 8 << 20;
    EIGHT_GIB_KIB.checked_div(pss_kib)
}

/// The table of idle memory, PSS compared with runc's and crun's.
pub fn memory_table(rows: &[MemRow]) -> String {
    let base = |name: &str| rows.iter().find(|r| r.name == name).and_then(|r| r.pss);
    let (runc, crun) = (base(REFERENCE), base(FAST_PEER));
    let times = |v: u64, b: Option<u64>| match b {
        Some(b) if b > 0 => format!("{:.1}×", v as f64 / b as f64),
        _ => "n/a".to_string(),
    };
    let dash = || "–".to_string();
    let mut out = String::from(
        "| runtime | processes | RSS | PSS | guest RAM touched | PSS ÷ runc | PSS ÷ crun | idle in 8 GiB | containers ok / failed |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |\n",
            r.name,
            r.processes.map_or_else(dash, |p| p.to_string()),
            r.rss.map_or_else(dash, mib),
            r.pss.map_or_else(dash, mib),
            r.guest.map_or_else(dash, mib),
            r.pss.map_or_else(dash, |p| times(p, runc)),
            r.pss.map_or_else(dash, |p| times(p, crun)),
            r.pss
                .and_then(fit_in_8_gib)
                .map_or_else(dash, |n| n.to_string()),
            r.ok,
            r.failed
        ));
    }
    out
}
