//! A mirror's running comparison (`docs/traffic.md`, "Compare"): how many answers were
//! compared, how many differed and how, both sides' latency distributions, the latest
//! differences, and the verdict they add up to.

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::{json, Value};

/// Compared answers below which the verdict is `insufficient`.
pub(crate) const ENOUGH: u64 = 100;

/// The latest differences kept.
const EXAMPLES: usize = 10;

/// The share of differing answers above which the verdict is `differs` (1 %).
const DIFFERS_OVER: f64 = 0.01;

/// The p99 ratio (mirror ÷ primary) above which the verdict is `slower`.
const SLOWER_OVER: f64 = 1.2;

/// One side's answer to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Side {
    /// Its status.
    pub(crate) status: u16,
    /// From the try's start until its answer's head.
    pub(crate) latency: Duration,
    /// Its body's hash, when it was read whole within the limit.
    pub(crate) body: Option<u64>,
}

/// What the figures say, the first that holds of the four.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Under [`ENOUGH`] answers compared.
    Insufficient,
    /// More than 1 % differ in status class or body.
    Differs,
    /// The mirror's p99 is over 1.2 × the primary's.
    Slower,
    /// Neither.
    Same,
}

impl Verdict {
    /// Its name in the API and the events.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Verdict::Insufficient => "insufficient",
            Verdict::Differs => "differs",
            Verdict::Slower => "slower",
            Verdict::Same => "same",
        }
    }
}

/// A difference, as `examples` shows it.
#[derive(Debug, Clone)]
struct Example {
    request_id: String,
    path: String,
    primary_status: u16,
    mirror_status: u16,
    /// `status` (their classes differ) or `body`.
    what: &'static str,
}

/// The running figures.
#[derive(Debug)]
pub(crate) struct Figures {
    compared: u64,
    status_mismatch: u64,
    body_mismatch: u64,
    primary: Histogram,
    mirror: Histogram,
    examples: VecDeque<Example>,
    verdict: Verdict,
}

impl Default for Figures {
    fn default() -> Self {
        Figures {
            compared: 0,
            status_mismatch: 0,
            body_mismatch: 0,
            primary: Histogram::default(),
            mirror: Histogram::default(),
            examples: VecDeque::with_capacity(EXAMPLES),
            verdict: Verdict::Insufficient,
        }
    }
}

impl Figures {
    /// Counts one request both sides answered; returns the verdict before and after
    /// when it changed.
    pub(crate) fn record(
        &mut self,
        (primary, mirror): (Side, Side),
        request_id: &str,
        path: &str,
    ) -> Option<(Verdict, Verdict)> {
        self.compared += 1;
        self.primary.add(primary.latency);
        self.mirror.add(mirror.latency);
        let what = if primary.status / 100 != mirror.status / 100 {
            self.status_mismatch += 1;
            Some("status")
        } else if matches!((primary.body, mirror.body), (Some(a), Some(b)) if a != b) {
            self.body_mismatch += 1;
            Some("body")
        } else {
            None
        };
        if let Some(what) = what {
            if self.examples.len() == EXAMPLES {
                self.examples.pop_front();
            }
            self.examples.push_back(Example {
                request_id: request_id.to_string(),
                path: path.to_string(),
                primary_status: primary.status,
                mirror_status: mirror.status,
                what,
            });
        }
        let was = self.verdict;
        self.verdict = self.judge();
        (was != self.verdict).then_some((was, self.verdict))
    }

    /// The first of the four verdicts that holds.
    fn judge(&self) -> Verdict {
        if self.compared < ENOUGH {
            return Verdict::Insufficient;
        }
        let differing = (self.status_mismatch + self.body_mismatch) as f64;
        if differing / self.compared as f64 > DIFFERS_OVER {
            return Verdict::Differs;
        }
        match self.ratio(0.99) {
            Some(r) if r > SLOWER_OVER => Verdict::Slower,
            _ => Verdict::Same,
        }
    }

    /// The verdict now.
    #[cfg(test)]
    pub(crate) fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// The mirror's latency quantile `q` over the primary's.
    fn ratio(&self, q: f64) -> Option<f64> {
        let p = self.primary.quantile(q)?;
        let m = self.mirror.quantile(q)?;
        Some(m / p.max(1.0))
    }

    /// The figures as `GET /admin/routes/{index}/mirror` shows them (beside the counts
    /// the mirror keeps itself).
    pub(crate) fn to_json(&self) -> serde_json::Map<String, Value> {
        let round = |r: Option<f64>| r.map(|r| (r * 1000.0).round() / 1000.0);
        let examples: Vec<Value> = (self.examples.iter().rev())
            .map(|e| {
                json!({
                    "request_id": e.request_id,
                    "path": e.path,
                    "primary_status": e.primary_status,
                    "mirror_status": e.mirror_status,
                    "differs_in": e.what,
                })
            })
            .collect();
        let mut m = serde_json::Map::new();
        m.insert("compared".into(), self.compared.into());
        m.insert("status_mismatch".into(), self.status_mismatch.into());
        m.insert("body_mismatch".into(), self.body_mismatch.into());
        m.insert("latency_p50_ratio".into(), round(self.ratio(0.5)).into());
        m.insert("latency_p99_ratio".into(), round(self.ratio(0.99)).into());
        m.insert("verdict".into(), self.verdict.name().into());
        m.insert("examples".into(), examples.into());
        m.insert("latency".into(), self.distributions());
        m
    }

    /// Both sides' latency distributions, by octave (what the dashboard draws): the
    /// octaves' lower bounds in microseconds and each side's count in each.
    fn distributions(&self) -> Value {
        let (p, m) = (self.primary.octaves(), self.mirror.octaves());
        let used = |o: &[u64]| o.iter().rposition(|&n| n > 0);
        let last = used(&p).max(used(&m)).map_or(0, |i| i + 1);
        let first = (0..last).find(|&i| p[i] + m[i] > 0).unwrap_or(last);
        let bounds: Vec<u64> = (first..last).map(|o| 1 << o).collect();
        json!({
            "bounds_us": bounds,
            "primary": p[first..last],
            "mirror": m[first..last],
            "primary_p50_ms": self.primary.quantile(0.5).map(|us| us / 1000.0),
            "primary_p99_ms": self.primary.quantile(0.99).map(|us| us / 1000.0),
            "mirror_p50_ms": self.mirror.quantile(0.5).map(|us| us / 1000.0),
            "mirror_p99_ms": self.mirror.quantile(0.99).map(|us| us / 1000.0),
        })
    }
}

/// Sub-buckets per octave: a quantile is known within about 3 %.
const SUB: usize = 16;
/// Octaves of microseconds kept: up to 2²⁸ µs (about 4.5 minutes); longer ones count
/// in the last.
const OCTAVES: usize = 28;
/// Buckets in all: the first octaves (below [`SUB`] µs) one per microsecond, then
/// [`SUB`] per octave.
const BUCKETS: usize = (OCTAVES - 3) * SUB;

/// A latency distribution with logarithmic buckets (as HdrHistogram's, coarser). Not
/// [`crate::stats::Histogram`]: its 13 Prometheus buckets (1 ms … 10 s) are too coarse for
/// a p99 ratio judged against 1.2.
#[derive(Debug)]
struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    n: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            n: 0,
        }
    }
}

/// The bucket of `us` microseconds.
fn bucket(us: u64) -> usize {
    let v = us.max(1);
    let octave = 63 - v.leading_zeros() as usize;
    let b = if octave < 4 {
        v as usize
    } else {
        let sub = ((v >> (octave - 4)) & (SUB as u64 - 1)) as usize;
        (octave - 3) * SUB + sub
    };
    b.min(BUCKETS - 1)
}

/// The middle of bucket `b`, in microseconds.
fn middle(b: usize) -> f64 {
    if b < SUB {
        return b as f64;
    }
    let octave = b / SUB + 3;
    let width = 1u64 << (octave - 4);
    let low = (SUB as u64 + (b % SUB) as u64) * width;
    low as f64 + width as f64 / 2.0
}

impl Histogram {
    fn add(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket(us)] += 1;
        self.n += 1;
    }

    /// The quantile `q` in microseconds (`None` while empty).
    fn quantile(&self, q: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(middle(b));
            }
        }
        Some(middle(BUCKETS - 1))
    }

    /// The counts by octave (octave `o` holds [2ᵒ, 2ᵒ⁺¹) µs).
    fn octaves(&self) -> Vec<u64> {
        let mut out = vec![0; OCTAVES];
        for (b, &c) in self.counts.iter().enumerate() {
            let o = if b < SUB {
                63 - (b.max(1) as u64).leading_zeros() as usize
            } else {
                b / SUB + 3
            };
            out[o.min(OCTAVES - 1)] += c;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(status: u16, ms: u64, body: u64) -> Side {
        Side {
            status,
            latency: Duration::from_millis(ms),
            body: Some(body),
        }
    }

    #[test]
    fn buckets_are_contiguous_and_ordered() {
        let mut last = 0;
        for us in 1..100_000u64 {
            let b = bucket(us);
            assert!(b == last || b == last + 1, "{us}: {b} after {last}");
            last = b;
            let m = middle(b);
            assert!(
                (m - us as f64).abs() <= us as f64 * 0.07 + 1.0,
                "{us} → {m}"
            );
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_close() {
        let mut h = Histogram::default();
        for ms in 1..=100 {
            h.add(Duration::from_millis(ms));
        }
        let p50 = h.quantile(0.5).unwrap();
        let p99 = h.quantile(0.99).unwrap();
        assert!((p50 - 50_000.0).abs() < 2_000.0, "{p50}");
        assert!((p99 - 99_000.0).abs() < 4_000.0, "{p99}");
        assert_eq!(h.octaves().iter().sum::<u64>(), 100);
    }

    #[test]
    fn the_verdict_is_the_first_that_holds() {
        let mut f = Figures::default();
        for _ in 0..99 {
            assert_eq!(
                f.record((side(200, 10, 1), side(200, 10, 1)), "id", "/"),
                None
            );
        }
        assert_eq!(f.verdict(), Verdict::Insufficient);
        let changed = f.record((side(200, 10, 1), side(200, 10, 1)), "id", "/");
        assert_eq!(changed, Some((Verdict::Insufficient, Verdict::Same)));
        f.record((side(200, 10, 1), side(200, 10, 2)), "a", "/x");
        f.record((side(200, 10, 1), side(503, 10, 1)), "b", "/y");
        assert_eq!(f.verdict(), Verdict::Differs);
        let j = f.to_json();
        assert_eq!(j["body_mismatch"], 1);
        assert_eq!(j["status_mismatch"], 1);
        assert_eq!(j["examples"][0]["request_id"], "b");
        assert_eq!(j["examples"][0]["mirror_status"], 503);
        // A 4xx and a 4xx of another code are the same class.
        let mut g = Figures::default();
        g.record((side(404, 10, 1), side(410, 10, 1)), "c", "/");
        assert_eq!(g.to_json()["status_mismatch"], 0);
    }

    #[test]
    fn a_slow_mirror_is_slower() {
        let mut f = Figures::default();
        for _ in 0..200 {
            f.record((side(200, 10, 1), side(200, 30, 1)), "id", "/");
        }
        assert_eq!(f.verdict(), Verdict::Slower);
        let ratio = f.to_json()["latency_p99_ratio"].as_f64().unwrap();
        assert!((2.7..3.3).contains(&ratio), "{ratio}");
    }
}
