//! What a lab run reports (`docs/lab.md`, "The runs"): one row per strategy
//! (requests, errors, latency percentiles of the requests served, each backend's share),
//! as a table, as JSON and as an SVG chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::load::Sample;

/// One strategy's results.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct StrategyResult {
    /// The strategy (`maglev+bounded` with a balance factor).
    pub(crate) strategy: String,
    pub(crate) requests: u64,
    /// Answers other than 2xx, and requests not answered within the timeout.
    pub(crate) errors: u64,
    /// Latency percentiles of the requests answered 2xx, in ms, from their scheduled
    /// send time; `null` when none was.
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p90_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) p999_ms: Option<f64>,
    /// Each backend's share of the requests answered.
    pub(crate) share: BTreeMap<String, f64>,
    /// warmup: the joining backend's share in each of its first seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) joiner_share_per_second: Option<Vec<f64>>,
    /// hot-key: the busiest backend's share over its fair share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_share_over_fair: Option<f64>,
    /// hot-key: the share of requests that went to their key's usual backend (the one
    /// that took most of that key's requests): 1 when every key sticks to one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) key_affinity: Option<f64>,
    /// Why this strategy's run failed (its other fields are then empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// Every answer came from one backend while the run had others: such a row shows
    /// where one key landed, not how the strategy balances, and is never marked best.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) single_backend: bool,
}

impl StrategyResult {
    /// The row of a strategy whose run failed with `error`.
    pub(crate) fn failed(strategy: String, error: String) -> StrategyResult {
        StrategyResult {
            strategy,
            requests: 0,
            errors: 0,
            p50_ms: None,
            p90_ms: None,
            p99_ms: None,
            p999_ms: None,
            share: BTreeMap::new(),
            joiner_share_per_second: None,
            max_share_over_fair: None,
            key_affinity: None,
            error: Some(error),
            single_backend: false,
        }
    }

    /// Whether its values may be marked best: it ran, and spread its traffic.
    fn ranked(&self) -> bool {
        self.error.is_none() && !self.single_backend
    }

    /// The share of requests not answered 2xx, in %; `None` for a failed run.
    fn error_percent(&self) -> Option<f64> {
        (self.error.is_none() && self.requests > 0)
            .then(|| self.errors as f64 * 100.0 / self.requests as f64)
    }

    /// The four percentiles, lowest first, with their chart marks.
    fn percentiles(&self) -> [(Option<f64>, &'static str); 4] {
        [
            (self.p50_ms, "●"),
            (self.p90_ms, "◆"),
            (self.p99_ms, "▲"),
            (self.p999_ms, "■"),
        ]
    }
}

/// A whole run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Report {
    pub(crate) scenario: &'static str,
    pub(crate) seed: u64,
    pub(crate) rps: u32,
    pub(crate) seconds: u32,
    pub(crate) results: Vec<StrategyResult>,
}

/// The value at quantile `q` of sorted `v` (nearest rank), rounded to the µs; `None`
/// for no values.
fn quantile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let rank = (q * v.len() as f64).ceil() as usize;
    Some(round3(v[rank.clamp(1, v.len()) - 1]))
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The row of `strategy` from its samples; `backends` are every backend's name.
pub(crate) fn summarize(
    strategy: String,
    samples: &[Sample],
    backends: &[String],
) -> StrategyResult {
    let mut served: Vec<f64> = samples
        .iter()
        .filter(|s| s.ok)
        .map(|s| s.latency.as_secs_f64() * 1000.0)
        .collect();
    served.sort_by(f64::total_cmp);
    let answered = samples
        .iter()
        .filter(|s| s.backend.is_some())
        .count()
        .max(1) as f64;
    let share = backends
        .iter()
        .map(|b| {
            let n = samples
                .iter()
                .filter(|s| s.backend.as_deref() == Some(b))
                .count();
            (b.clone(), round3(n as f64 / answered))
        })
        .collect::<BTreeMap<String, f64>>();
    let single_backend = share.len() > 1 && share.values().any(|&s| s >= SINGLE);
    StrategyResult {
        strategy,
        requests: samples.len() as u64,
        errors: samples.iter().filter(|s| !s.ok).count() as u64,
        p50_ms: quantile(&served, 0.5),
        p90_ms: quantile(&served, 0.9),
        p99_ms: quantile(&served, 0.99),
        p999_ms: quantile(&served, 0.999),
        share,
        joiner_share_per_second: None,
        max_share_over_fair: None,
        key_affinity: None,
        error: None,
        single_backend,
    }
}

/// A backend that took this share of the answers took them all (shares are rounded to
/// a thousandth).
const SINGLE: f64 = 0.999;

/// `joiner`'s share of the answers in each second from `from` on, for `n` seconds.
pub(crate) fn share_per_second(
    samples: &[Sample],
    joiner: &str,
    from: Duration,
    n: u32,
) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let lo = from + Duration::from_secs(u64::from(i));
            let hi = lo + Duration::from_secs(1);
            let second: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.at >= lo && s.at < hi && s.backend.is_some())
                .collect();
            let mine = second
                .iter()
                .filter(|s| s.backend.as_deref() == Some(joiner))
                .count();
            round3(mine as f64 / second.len().max(1) as f64)
        })
        .collect()
}

/// The busiest backend's share over the fair share, and the share of requests that
/// went to their key's usual backend.
pub(crate) fn balance_and_affinity(r: &StrategyResult, samples: &[Sample]) -> (f64, f64) {
    let fair = 1.0 / r.share.len().max(1) as f64;
    let busiest = r.share.values().copied().fold(0.0, f64::max);
    let mut by_key: BTreeMap<u32, BTreeMap<&str, u64>> = BTreeMap::new();
    for s in samples {
        if let Some(b) = &s.backend {
            *by_key.entry(s.key).or_default().entry(b).or_default() += 1;
        }
    }
    let usual: u64 = by_key
        .values()
        .map(|c| c.values().max().copied().unwrap_or(0))
        .sum();
    let all: u64 = by_key.values().flat_map(|c| c.values()).sum();
    (
        round3(busiest / fair),
        round3(usual as f64 / all.max(1) as f64),
    )
}

/// A column of the table: its value for a row, if it has one.
type Column = Box<dyn Fn(&StrategyResult) -> Option<f64>>;

/// The table: one row per strategy, `*` after the best value of each column (the
/// fewest errors, the lowest latency); `-` where a row has no value (no request
/// answered 2xx, or the run failed), left out of the marking, as a row whose answers
/// all came from one backend is.
pub(crate) fn table(report: &Report) -> String {
    let rs = &report.results;
    let backends: Vec<&String> = rs
        .iter()
        .find(|r| !r.share.is_empty())
        .map(|r| r.share.keys().collect())
        .unwrap_or_default();
    let cols: [(&str, Column); 5] = [
        ("errors %", Box::new(StrategyResult::error_percent)),
        ("p50 ms", Box::new(|r| r.p50_ms)),
        ("p90 ms", Box::new(|r| r.p90_ms)),
        ("p99 ms", Box::new(|r| r.p99_ms)),
        ("p999 ms", Box::new(|r| r.p999_ms)),
    ];
    let best: Vec<f64> = cols
        .iter()
        .map(|(_, f)| {
            rs.iter()
                .filter(|r| r.ranked())
                .filter_map(f)
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    // The first column fits the longest row name (`least_response_time+success_rate`).
    let w = rs
        .iter()
        .map(|r| r.strategy.len())
        .max()
        .unwrap_or(0)
        .max(26);
    let mut out = format!("{:<w$} {:>8}", "strategy", "requests");
    for (name, _) in &cols {
        let _ = write!(out, " {name:>10}");
    }
    for b in &backends {
        let _ = write!(out, " {:>7}", format!("{b} %"));
    }
    out.push('\n');
    for r in rs {
        let _ = write!(out, "{:<w$} {:>8}", r.strategy, r.requests);
        for ((_, f), b) in cols.iter().zip(&best) {
            let _ = match f(r) {
                Some(v) => {
                    let mark = if rs.len() > 1 && r.ranked() && v <= *b {
                        "*"
                    } else {
                        " "
                    };
                    write!(out, " {:>9}{mark}", format!("{v:.2}"))
                }
                None => write!(out, " {:>9} ", "-"),
            };
        }
        for b in &backends {
            let _ = write!(
                out,
                " {:>7.1}",
                r.share.get(*b).copied().unwrap_or(0.0) * 100.0
            );
        }
        out.push('\n');
    }
    out
}

/// Each backend's colour in the chart, in name order.
const COLOURS: [&str; 6] = [
    "#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2",
];

/// The chart's geometry: a latency axis (log) on the left, share bars on the right,
/// one row per strategy.
struct Chart {
    height: f64,
    /// The lowest latency drawn, and the axis's first and last decades (log10).
    lo: f64,
    decades: (f64, f64),
}

impl Chart {
    const ROW: f64 = 26.0;
    const TOP: f64 = 50.0;
    const LATENCY: (f64, f64) = (190.0, 460.0);
    const SHARE: (f64, f64) = (700.0, 260.0);

    /// Fits the latency axis to the percentiles of `rs`.
    fn new(rs: &[StrategyResult]) -> Chart {
        let max = rs.iter().filter_map(|r| r.p999_ms).fold(1.0, f64::max);
        let lo = rs
            .iter()
            .filter_map(|r| r.p50_ms)
            .filter(|v| *v > 0.0)
            .fold(max, f64::min)
            .max(0.1);
        let first = lo.log10().floor();
        Chart {
            height: Self::TOP + Self::ROW * rs.len() as f64 + 50.0,
            lo,
            decades: (first, max.log10().ceil().max(first + 1.0)),
        }
    }

    /// Where latency `v` (ms) is on the axis.
    fn x(&self, v: f64) -> f64 {
        let (lx, lw) = Self::LATENCY;
        let (a, b) = self.decades;
        lx + (v.max(self.lo).log10() - a) / (b - a) * lw
    }

    /// A grid line and its label at every decade.
    fn axis(&self, s: &mut String) {
        let mut decade = self.decades.0;
        while decade <= self.decades.1 {
            let v = 10f64.powf(decade);
            let px = self.x(v);
            let _ = writeln!(
                s,
                "<line x1=\"{px:.1}\" y1=\"{}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{v}</text>",
                Self::TOP,
                self.height - 40.0,
                self.height - 26.0
            );
            decade += 1.0;
        }
    }

    /// Row `i`: the strategy, its percentiles (or its error), its share bar.
    fn row(&self, s: &mut String, i: usize, r: &StrategyResult) {
        let y = Self::TOP + Self::ROW * i as f64 + Self::ROW / 2.0;
        let _ = writeln!(
            s,
            "<text x=\"10\" y=\"{:.1}\">{}</text>",
            y + 4.0,
            xml_escape(&r.strategy)
        );
        if let Some(e) = &r.error {
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{:.1}\" fill=\"#c00\">run failed: {}</text>",
                Self::LATENCY.0,
                y + 4.0,
                xml_escape(e)
            );
        }
        if let (Some(a), Some(b)) = (r.p50_ms, r.p999_ms) {
            let _ = writeln!(
                s,
                "<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#888\"/>",
                self.x(a),
                self.x(b)
            );
        }
        for (v, shape) in r.percentiles() {
            let Some(v) = v else { continue };
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\"><title>{v} ms</title>{shape}</text>",
                self.x(v),
                y + 4.0
            );
        }
        let (mut at, sw) = Self::SHARE;
        for (j, (b, share)) in r.share.iter().enumerate() {
            let w = share * sw;
            let _ = writeln!(
                s,
                "<rect x=\"{at:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"16\" fill=\"{}\"><title>{b}: {:.1} %</title></rect>",
                y - 8.0,
                COLOURS[j % COLOURS.len()],
                share * 100.0
            );
            at += w;
        }
    }

    /// Each backend's colour, under the share bars.
    fn legend(&self, s: &mut String, backends: impl Iterator<Item = String>) {
        for (j, b) in backends.enumerate() {
            let lx = Self::SHARE.0 + 60.0 * j as f64;
            let _ = writeln!(
                s,
                "<rect x=\"{lx}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{b}</text>",
                self.height - 36.0,
                COLOURS[j % COLOURS.len()],
                lx + 14.0,
                self.height - 27.0
            );
        }
    }
}

/// The chart: latency percentiles per strategy on a log axis (left), each backend's
/// share per strategy (right).
pub(crate) fn svg(report: &Report) -> String {
    let rs = &report.results;
    let chart = Chart::new(rs);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"980\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">fulcrum lab: {} ({} req/s for {} s, seed {})</text>\n\
         <text x=\"{}\" y=\"40\">latency, ms (log): p50 ● p90 ◆ p99 ▲ p999 ■</text>\n\
         <text x=\"{}\" y=\"40\">share per backend</text>\n",
        chart.height, report.scenario, report.rps, report.seconds, report.seed,
        Chart::LATENCY.0, Chart::SHARE.0
    );
    chart.axis(&mut s);
    for (i, r) in rs.iter().enumerate() {
        chart.row(&mut s, i, r);
    }
    if let Some(first) = rs.iter().find(|r| !r.share.is_empty()) {
        chart.legend(&mut s, first.share.keys().cloned());
    }
    s.push_str("</svg>\n");
    s
}

/// `text` with XML's special characters escaped.
fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ms: u64, backend: &str, ok: bool) -> Sample {
        Sample {
            at: Duration::ZERO,
            latency: Duration::from_millis(ms),
            ok,
            backend: Some(backend.into()),
            key: 0,
        }
    }

    #[test]
    fn percentiles_shares_and_the_marked_best() {
        let mut a: Vec<Sample> = (1..=100).map(|i| sample(i, "b1", true)).collect();
        a.push(sample(5, "b2", false));
        let names = vec!["b1".to_string(), "b2".to_string()];
        let ra = summarize("round_robin".into(), &a, &names);
        assert_eq!((ra.requests, ra.errors), (101, 1));
        assert_eq!(
            (ra.p50_ms, ra.p99_ms, ra.p999_ms),
            (Some(50.0), Some(99.0), Some(100.0))
        );
        assert!((ra.share["b1"] - 0.990).abs() < 1e-9);
        let b: Vec<Sample> = (1..=100)
            .map(|i| sample(i / 2 + 1, ["b1", "b2"][i as usize % 2], true))
            .collect();
        let rb = summarize("peak_ewma".into(), &b, &names);
        let report = Report {
            scenario: "slow-backend",
            seed: 1,
            rps: 10,
            seconds: 10,
            results: vec![ra, rb],
        };
        let t = table(&report);
        let peak = t.lines().find(|l| l.starts_with("peak_ewma")).unwrap();
        assert!(peak.contains("0.00*"), "{t}");
        assert!(peak.contains("50.00*"), "{t}");
        let svg = svg(&report);
        assert!(svg.starts_with("<svg") && svg.contains("peak_ewma") && svg.ends_with("</svg>\n"));
    }

    #[test]
    fn a_row_whose_answers_all_came_from_one_backend_is_never_best() {
        let names = vec!["b1".to_string(), "b2".to_string()];
        // Fast, but every answer from b1: one key's luck.
        let one: Vec<Sample> = (1..=100).map(|i| sample(i, "b1", true)).collect();
        let two: Vec<Sample> = (1..=100)
            .map(|i| sample(i + 10, if i % 2 == 0 { "b1" } else { "b2" }, true))
            .collect();
        let lucky = summarize("maglev".into(), &one, &names);
        assert!(lucky.single_backend);
        let spread = summarize("least_connections".into(), &two, &names);
        assert!(!spread.single_backend);
        let report = Report {
            scenario: "slow-backend",
            seed: 1,
            rps: 10,
            seconds: 10,
            results: vec![lucky, spread],
        };
        let t = table(&report);
        let line = |name: &str| t.lines().find(|l| l.starts_with(name)).unwrap().to_string();
        assert!(!line("maglev").contains('*'), "{t}");
        assert!(line("least_connections").contains("60.00*"), "{t}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["results"][0]["single_backend"], true);
        assert!(json["results"][1].get("single_backend").is_none());
        // One backend in the run: nothing else could take the traffic.
        let alone = summarize("round_robin".into(), &one, &names[..1]);
        assert!(!alone.single_backend);
    }

    #[test]
    fn a_row_without_answers_or_a_failed_run_has_no_values_and_is_never_best() {
        let names = vec!["b1".to_string()];
        let served: Vec<Sample> = (1..=10).map(|i| sample(i, "b1", true)).collect();
        let refused: Vec<Sample> = (1..=10).map(|i| sample(i, "b1", false)).collect();
        let empty = summarize("least_connections".into(), &refused, &names);
        assert_eq!((empty.p50_ms, empty.p999_ms), (None, None));
        let report = Report {
            scenario: "overload",
            seed: 1,
            rps: 10,
            seconds: 1,
            results: vec![
                summarize("round_robin".into(), &served, &names),
                empty,
                StrategyResult::failed("maglev".into(), "backend <b1> did not start".into()),
            ],
        };
        let t = table(&report);
        let line = |name: &str| t.lines().find(|l| l.starts_with(name)).unwrap().to_string();
        assert!(line("round_robin").contains("5.00*"), "{t}");
        assert!(!line("least_connections").contains('*'), "{t}");
        assert!(line("least_connections").contains(" - "), "{t}");
        assert!(!line("maglev").contains('*'), "{t}");
        let json = serde_json::to_value(&report).unwrap();
        assert!(json["results"][1]["p99_ms"].is_null());
        assert_eq!(json["results"][2]["error"], "backend <b1> did not start");
        assert!(svg(&report).contains("run failed: backend &lt;b1&gt; did not start"));
    }
}
