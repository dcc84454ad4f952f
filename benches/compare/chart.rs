//! The report's chart: cold start (part a) and idle memory (part c) per
//! runtime, and the microvm tier's cold start part by part beside the QEMU
//! floor, as horizontal bars in one SVG written beside the markdown report
//! (`AGENTVM_BENCH_REPORT` with the extension `.svg`). Plain SVG text, no
//! plotting library: panels of labelled bars.

/// What the chart shows; a panel with no bars is left out.
#[derive(Debug, Default)]
pub struct Chart {
    /// Median wall clock of a round of part (a), in milliseconds.
    pub cold_start: Vec<(String, f64)>,
    /// Median PSS of an idle container of part (c), in MiB.
    pub idle_pss: Vec<(String, f64)>,
    /// The microvm tier's round of part (a) by part, in milliseconds, the
    /// whole round and the QEMU floor's last; titled `parts_title`.
    pub parts: Vec<(String, f64)>,
    pub parts_title: String,
}

const WIDTH: f64 = 760.0;
const LABEL: f64 = 230.0;
const BAR_SPACE: f64 = 420.0;
const ROW: f64 = 24.0;
const TITLE: f64 = 34.0;

impl Chart {
    pub fn is_empty(&self) -> bool {
        self.cold_start.is_empty() && self.idle_pss.is_empty() && self.parts.is_empty()
    }

    /// The SVG document.
    pub fn svg(&self, title: &str) -> String {
        let mut body = String::new();
        let mut y = TITLE;
        for (heading, unit, bars) in [
            (
                "cold start: create + start + wait + delete of /bin/true (median)",
                "ms",
                &self.cold_start,
            ),
            (
                "idle memory per container: PSS of sleep (median)",
                "MiB",
                &self.idle_pss,
            ),
            (self.parts_title.as_str(), "ms", &self.parts),
        ] {
            if bars.is_empty() {
                continue;
            }
            y = panel(&mut body, y, heading, unit, bars);
        }
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{h}\" \
             viewBox=\"0 0 {WIDTH} {h}\" font-family=\"monospace\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"8\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>\n{body}</svg>\n",
            escape(title),
            h = y + 8.0,
        )
    }
}

/// One panel at height `y`; returns where the next one starts.
fn panel(out: &mut String, y: f64, heading: &str, unit: &str, bars: &[(String, f64)]) -> f64 {
    out.push_str(&format!(
        "<text x=\"8\" y=\"{:.0}\" font-weight=\"bold\">{}</text>\n",
        y + 14.0,
        escape(heading)
    ));
    let top = y + 22.0;
    let max = bars
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    for (i, (name, value)) in bars.iter().enumerate() {
        let row = top + i as f64 * ROW;
        let len = if max > 0.0 && value.is_finite() && *value > 0.0 {
            (value / max * BAR_SPACE).max(1.0)
        } else {
            0.0
        };
        out.push_str(&format!(
            "<text x=\"8\" y=\"{:.0}\">{}</text>\n\
             <rect x=\"{LABEL}\" y=\"{:.0}\" width=\"{len:.1}\" height=\"{:.0}\" fill=\"{}\"/>\n\
             <text x=\"{:.1}\" y=\"{:.0}\">{} {unit}</text>\n",
            row + 15.0,
            escape(name),
            row + 4.0,
            ROW - 8.0,
            colour(name),
            LABEL + len + 6.0,
            row + 15.0,
            figure(*value),
        ));
    }
    top + bars.len() as f64 * ROW + 10.0
}

/// agentvm's tiers in colour, the peers and the floor in greys.
fn colour(name: &str) -> &'static str {
    if name.contains("microvm") {
        "#d9822b"
    } else if name.contains("agentvm") {
        "#2b6cb0"
    } else if name.contains("floor") {
        "#b0b0b0"
    } else {
        "#606060"
    }
}

fn figure(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
