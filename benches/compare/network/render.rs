//! The network part's tables: absolute figures and their ratio to runc's.

use std::time::Duration;

use super::tools::{Http, Throughput};
use super::{
    Cell, Figures, CONTAINER_POLICY_RUNTIME, POLICY, POLICY_RUNTIME, WRK_CONNS_IN, WRK_CONNS_OUT,
};
use crate::runtimes::{MICROVM, REFERENCE};

fn rate(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else {
        format!("{:.0} Mbit/s", bps / 1e6)
    }
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn times(v: f64, base: Option<f64>) -> String {
    match base {
        Some(b) if b > 0.0 => format!("{:.2}×", v / b),
        _ => "n/a".to_string(),
    }
}

/// A difference of durations, signed, in milliseconds with two decimals.
pub fn diff(a: Duration, b: Duration) -> String {
    signed(a, b, ms)
}

/// `a − b` with its sign, the magnitude written by `fmt`.
pub fn signed(a: Duration, b: Duration, fmt: fn(Duration) -> String) -> String {
    if a >= b {
        format!("+{}", fmt(a - b))
    } else {
        format!("−{}", fmt(b - a))
    }
}

/// One table: a header and, per row, the cells `cells` makes from the
/// row's figures and runc's (`None` when runc has none).
fn table(
    header: &[&str],
    figures: &[Figures],
    cells: impl Fn(&Figures, Option<&Figures>) -> Vec<String>,
) -> String {
    let runc = figures.iter().find(|f| f.name == REFERENCE);
    let mut out = format!("| runtime | {} |\n|---|", header.join(" | "));
    out.push_str(&"---:|".repeat(header.len()));
    out.push('\n');
    for f in figures {
        let row = match &f.whole {
            Some(why) => {
                let mut v = vec![why.text()];
                v.resize(header.len(), "–".to_string());
                v
            }
            None => cells(f, runc),
        };
        out.push_str(&format!("| {} | {} |\n", f.name, row.join(" | ")));
    }
    out
}

/// A cell's text: the value, or why there is none.
fn show<T>(c: &Cell<T>, f: impl Fn(&T) -> String) -> String {
    match c {
        Cell::Done(v) => f(v),
        Cell::Unmeasured(why) => why.text(),
        Cell::Failed(_) => "failed (below)".to_string(),
    }
}

/// A value and its ratio to runc's: two cells.
fn with_ratio<T>(
    c: &Cell<T>,
    base: Option<&Cell<T>>,
    value: impl Fn(&T) -> f64,
    text: impl Fn(&T) -> String,
) -> [String; 2] {
    let b = base.and_then(Cell::done).map(&value);
    match c.done() {
        Some(v) => [text(v), times(value(v), b)],
        None => [show(c, text), "–".to_string()],
    }
}

fn throughput_cells(
    c: &Cell<Throughput>,
    base: Option<&Cell<Throughput>>,
    secs: Option<u64>,
) -> Vec<String> {
    let mut v = with_ratio(c, base, |t| t.bits_per_second, |t| rate(t.bits_per_second)).to_vec();
    if let Some(secs) = secs {
        // The client's wall clock beyond the test itself: connection
        // set-up (and, in a container, `docker exec`).
        v.push(match c.done() {
            Some(t) => signed(t.wall, Duration::from_secs(secs), crate::stats::ms),
            None => "–".to_string(),
        });
    }
    v
}

fn http_cells(c: &Cell<Http>, base: Option<&Cell<Http>>, per_connection: bool) -> Vec<String> {
    let secs = |d: Duration| d.as_secs_f64();
    let mut v = Vec::new();
    if per_connection {
        v.extend(with_ratio(
            c,
            base,
            |h| h.mean_cycle().map_or(0.0, secs),
            |h| h.mean_cycle().map_or_else(|| "–".into(), ms),
        ));
    } else {
        v.extend(with_ratio(c, base, Http::per_second, |h| {
            format!("{:.0}", h.per_second())
        }));
    }
    v.extend(with_ratio(c, base, |h| secs(h.p50), |h| ms(h.p50)));
    v.extend(with_ratio(c, base, |h| secs(h.p99), |h| ms(h.p99)));
    v.push(match c.done() {
        Some(h) => format!("{} / {}", h.requests, h.errors),
        None => "–".to_string(),
    });
    v
}

/// What the proxy adds per connection: the microvm rows' difference.
fn proxy_cost(figures: &[Figures]) -> Option<String> {
    let get = |name: &str| {
        figures
            .iter()
            .find(|f| f.name == name)
            .and_then(|f| f.http_out.done().copied())
    };
    let (direct, proxied) = (get(MICROVM)?, get("agentvm microvm + policy")?);
    let (a, b) = (proxied.mean_cycle()?, direct.mean_cycle()?);
    Some(format!(
        "Through the proxy, a connection (connect, request, response, close) takes {} against \
         {} direct from the same microVM ({}, {:.1}×); request to response p50 {} against {} \
         ({}).\n",
        ms(a),
        ms(b),
        diff(a, b),
        a.as_secs_f64() / b.as_secs_f64().max(1e-9),
        ms(proxied.p50),
        ms(direct.p50),
        diff(proxied.p50, direct.p50),
    ))
}

/// The throughput and HTTP tables, with the first failure of each row.
pub fn throughput(figures: &[Figures], secs: u64) -> String {
    let inbound = table(
        &["host → container", "÷ runc", "container → host", "÷ runc"],
        figures,
        |f, r| {
            let mut v = throughput_cells(&f.into, r.map(|r| &r.into), None);
            v.extend(throughput_cells(&f.out_of, r.map(|r| &r.out_of), None));
            v
        },
    );
    let outbound = table(
        &[
            "container → web",
            "÷ runc",
            "set-up",
            "web → container",
            "÷ runc",
            "set-up",
        ],
        figures,
        |f, r| {
            let mut v = throughput_cells(&f.to_web, r.map(|r| &r.to_web), Some(secs));
            v.extend(throughput_cells(
                &f.from_web,
                r.map(|r| &r.from_web),
                Some(secs),
            ));
            v
        },
    );
    let http_in = table(
        &[
            "requests/s",
            "÷ runc",
            "p50",
            "÷ runc",
            "p99",
            "÷ runc",
            "requests / errors",
        ],
        figures,
        |f, r| http_cells(&f.http_in, r.map(|r| &r.http_in), false),
    );
    let http_out = table(
        &[
            "per connection (mean)",
            "÷ runc",
            "request → response p50",
            "÷ runc",
            "p99",
            "÷ runc",
            "requests / errors",
        ],
        figures,
        |f, r| http_cells(&f.http_out, r.map(|r| &r.http_out), true),
    );
    let mut notes = String::new();
    for f in figures {
        if let Some((what, e)) = f.failures().first() {
            notes.push_str(&format!(
                "\n{}: {what} failed (and {} other figure(s)); the first:\n\n```\n{}\n```\n",
                f.name,
                f.failures().len() - 1,
                e.trim()
            ));
        }
    }
    format!(
        "The rows run one after the other, each in a container of its own on a user-defined \
         network of the test dockerd, one run of {secs} s per figure. \"+ policy\" is Docker \
         runtime `{POLICY_RUNTIME}` (`{CONTAINER_POLICY_RUNTIME}` in the container tier, \
         `{POLICY}`): the only connections it allows are to the name `web`, port 80, the \
         benchmark's server.\n\n\
         ### TCP throughput, connections from outside (`iperf3`)\n\n\
         `iperf3 -s` in the container, `iperf3 -c` on the host to the container's address \
         (over the network's bridge, no docker-proxy); \"container → host\" is `-R`. The \
         receiver's rate:\n\n{inbound}\n\
         ### TCP throughput, connections made by the container (`iperf3`)\n\n\
         `iperf3 -c web -p 80` in the container (`docker exec`), the server in a runc \
         container named `web` on the same network; \"web → container\" is `-R`. Under a \
         policy both of iperf3's connections go through agentvm's proxy. \"set-up\" is the \
         client's wall clock beyond the {secs} s test (`docker exec`, connecting, the \
         proxy's judgement):\n\n{outbound}\n\
         ### HTTP from the host (`wrk`)\n\n\
         `wrk -t1 -c{WRK_CONNS_IN}` on the host against busybox `httpd` in the container \
         (a small page; `httpd` closes each connection, so each request is a new \
         connection). Latency is wrk's, from the request written to the response read:\
         \n\n{http_in}\n\
         ### A connection through the proxy vs direct (`wrk` in the container)\n\n\
         `wrk -t1 -c{WRK_CONNS_OUT}` in the container against `httpd` in the runc container \
         `web`, one connection at a time, a new one per request. \"Per connection\" is the \
         run's length ÷ requests: connect, request, response and close. Under a policy the \
         container's connect is answered by the proxy in the container's namespace, which \
         reads the request, judges it, connects to `web` and relays, so the proxy's cost \
         is in both columns:\n\n{http_out}\n{}{notes}",
        proxy_cost(figures).unwrap_or_default()
    )
}
